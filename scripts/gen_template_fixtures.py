#!/usr/bin/env python3
"""Writes the chat-template parity fixtures under tests/data/templates/.

Each template is rendered with Python's jinja2 configured exactly as Hugging
Face transformers configures it for apply_chat_template (sandboxed
environment, trim_blocks and lstrip_blocks on, the loop-controls extension,
a json.dumps `tojson` that keeps non-ASCII characters and key order, and the
globals raise_exception and strftime_now), for a set of conversations.
tests/test_jinja.c renders the same templates with cellm's interpreter and
compares byte for byte.

Templates: SmolLM2's, read from the GGUF file in the model store (the
`gguf` package), and widely used public formats written below as literals
(ChatML / Qwen2.5 with tools, Llama 3 and 3.1 with tools, Gemma 3, Mistral
[INST] with tools, Phi-3), plus one that exercises the language features
templates use.

Output:
  tests/data/templates/NAME.jinja            the template
  tests/data/templates/cases/NAME.CASE.json  the variables (a JSON object)
  tests/data/templates/cases/NAME.CASE.out   the expected text, or
  tests/data/templates/cases/NAME.CASE.err   the message it raised
  tests/data/templates/index.txt             "NAME CASE out|err" lines

Usage: python3 scripts/gen_template_fixtures.py [--model PATH]
Needs: pip install jinja2 gguf
"""
import argparse
import json
import os
import shutil
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "templates")


def make_env():
    """The environment transformers' _compile_jinja_template builds."""

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


CHATML_QWEN = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

LLAMA3 = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}"""

LLAMA31 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

GEMMA3 = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
"""

MISTRAL = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

PHI3 = r"""{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %}"""

# Not a model's template: the language features real templates lean on,
# in one place, so their semantics are compared with jinja2 directly.
FEATURES = r"""{#- comment -#}
{%- macro turn(role, text, suffix='\n') -%}
<{{ role | upper }}>{{ text }}{{ suffix }}
{%- endmacro -%}
{%- set ns = namespace(count=0, roles=[], last=none) -%}
{%- for m in messages -%}
  {%- set ns.count = ns.count + 1 -%}
  {%- set ns.roles = ns.roles + [m.role] -%}
  {%- set ns.last = m -%}
{%- endfor -%}
count={{ ns.count }} roles={{ ns.roles | join(',') }} unique={{ ns.roles | unique | list }} last={{ ns.last.role if ns.last else 'none' }}
{% for m in messages if m.role != 'system' -%}
{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} first={{ loop.first }} last={{ loop.last }} {{ turn(m['role'], m.content | trim) }}
{%- if not loop.last %}{{ loop.cycle('odd', 'even') }}{% endif %}
{% else %}no messages
{% endfor -%}
{%- set s = "  Hello, World!  " -%}
[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] {{ s.strip().lower() }} {{ s.strip().upper() }} {{ s | trim | replace('l', 'L') }} {{ s.replace('o', '0', 1) }}
{{ s.strip().startswith('Hello') }} {{ s.strip().endswith(('!', '?')) }} {{ s.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }}
{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} {{ [1, 2, 3, 4, 5][1:] }} {{ [1, 2, 3, 4, 5][::2] }} {{ [1, 2, 3][-1] }} {{ 'héllo'[1] }} {{ 'héllo' | length }}
{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 1.5 + 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 3 * 'ab' }} {{ 'x' ~ 1 ~ none ~ true }}
{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'a' in 'cat' }} {{ 'z' not in ['a', 'b'] }} {{ 'k' in {'k': 1} }} {{ not true or false and true }} {{ none or 'default' }} {{ 0 and 1 }}
{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ {} is mapping }} {{ [] is iterable }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 'a' is eq 'a' }} {{ 1 is ne 2 }}
{{ x | default('dflt') }} {{ '' | default('empty', true) }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort | join }} {{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} {{ 'hello world' | capitalize }} {{ 'hello big-world' | title }}
{{ '42' | int + 1 }} {{ '3.7' | int }} {{ 'x' | int(5) }} {{ 3 | string ~ '!' }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ [1, 2, 3] | reverse | list }} {{ [1, 2, 3] | length }} {{ {'a': 1} | length }}
{%- set d = {'b': 2, 'a': [1, 'x', none, true, 1.5], 'c': {'n': 'é"\\\n'}} %}
{{ d | tojson }} {{ d | tojson(indent=2) }} {{ d.items() | list }} {{ d | items | list }} {{ d.keys() | list }} {{ d.get('zz', 'missing') }} {{ d.get('b') }} {{ d['a'][1] }} {{ d.a.1 }}
{% for k, v in d | dictsort %}{{ k }}={{ v }};{% endfor %} {% for k, v in d.items() %}{{ k }}{% if not loop.last %},{% endif %}{% endfor %}
{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ messages | rejectattr('role', 'eq', 'user') | list | length }} {{ messages | map(attribute='role') | join('|') }}
{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ ['a', 'b'] | map('upper') | list }} {{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ [1, 2, 3] | sum }} {{ [4, 9, 2] | max }}
{%- for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}
{% set block %}captured {{ 1 + 1 }}{% endset %}{{ block }} {% filter upper %}shout {{ 'this' }}{% endfilter %}
{{ 'yes' if messages | length > 1 else 'no' }} {{ (1, 2) }} {{ (1,) }} {{ [('a', 1)] }} {{ {'q': "it's"} }} {{ "say \"hi\"" }} {{ '\u00e9\x41\t|' }}
{% raw %}{{ not evaluated }}{% endraw %}
    {%+ if true %}kept indent{% endif %}
{{ "%-5s|" | length }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'abc'.find('c') }} {{ 'x-y-z'.count('-') }} {{ '-'.join(['p', 'q']) }} {{ 'AbC'.isupper() }}
{{ "a\tb  c\n".split(None, 1) }} {{ 'straße' | upper }} {{ 2.5 | round }} {{ 2.45 | round(1) }} {{ 7 | round(-1) }} {{ '0x1A' | int(0, 16) }} {{ 'x' if false }}|{{ [1, 2, 3][10] }}|{{ 'ÉCOLE' | lower }}
{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ undefined_thing }}|
"""


def conversations():
    """(case name, messages, extra variables) tuples used for every template."""
    sys_msg = {"role": "system", "content": "You are a careful assistant."}
    u1 = {"role": "user", "content": "Hello! How are you?"}
    a1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
    u2 = {"role": "user", "content": "Tell me a joke about C."}
    special = {"role": "user", "content":
               "  {{ not a tag }} {% neither %} {# nor #} 'quotes' \"double\" back\\slash\n"
               "\ttab <|im_end|> <end_of_turn> [INST] </s> & < >  \n\n"}
    uni = {"role": "user", "content":
           "\u00a0Ünïcödé: 日本語のテキスト, emoji 😀🎉, Ελληνικά, Кириллица, עברית\u3000"}
    empty_u = {"role": "user", "content": ""}
    empty_a = {"role": "assistant", "content": ""}
    return [
        ("single", [u1], {}),
        ("system", [sys_msg, u1], {}),
        ("multi", [sys_msg, u1, a1, u2], {}),
        ("multi_nosys", [u1, a1, u2], {}),
        ("special", [special], {}),
        ("unicode", [sys_msg, uni, a1, uni], {}),
        ("empty", [empty_u, empty_a, u2], {}),
        ("alternation", [u1, u2], {}),
    ]


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city, e.g. \"Paris\" — in °C",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "The city"},
                                      "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "noop", "description": "Does nothing", "parameters": {"type": "object", "properties": {}}}},
]


def tool_conversations():
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call12345", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]}
    result = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
              "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}
    return [
        ("tools", [{"role": "system", "content": "Use tools when useful."},
                   {"role": "user", "content": "Weather in Zürich?"}], {"tools": TOOLS}),
        ("tool_calls", [{"role": "user", "content": "Weather in Zürich?"}, call, result],
         {"tools": TOOLS}),
    ]


TEMPLATES = {
    # name: (template source, bos, eos, which conversation sets)
    "chatml_qwen25": (CHATML_QWEN, "", "<|im_end|>", ("base", "tools")),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>", ("base",)),
    "llama31": (LLAMA31, "<|begin_of_text|>", "<|eot_id|>", ("base", "tools")),
    "gemma3": (GEMMA3, "<bos>", "<eos>", ("base",)),
    "mistral": (MISTRAL, "<s>", "</s>", ("base", "tools")),
    "phi3": (PHI3, "<s>", "<|endoftext|>", ("base",)),
    "features": (FEATURES, "<B>", "<E>", ("base",)),
}


def smollm2_template(path):
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/cellm/models/smollm2-135m.gguf"))
    args = ap.parse_args()
    templates = dict(TEMPLATES)
    templates["smollm2"] = (smollm2_template(args.model), "<|im_start|>", "<|im_end|>", ("base",))

    env = make_env()
    cases_dir = os.path.join(OUT, "cases")
    if os.path.isdir(cases_dir):
        shutil.rmtree(cases_dir)
    os.makedirs(cases_dir)
    index = []
    for name in sorted(templates):
        src, bos, eos, sets = templates[name]
        with open(os.path.join(OUT, name + ".jinja"), "w", encoding="utf-8", newline="") as fh:
            fh.write(src)
        tpl = env.from_string(src)
        convs = []
        if "base" in sets:
            convs += conversations()
        if "tools" in sets:
            convs += tool_conversations()
        for case, messages, extra in convs:
            for agp in (False, True):
                cname = "%s_%s" % (case, "gen" if agp else "nogen")
                variables = {"messages": messages, "add_generation_prompt": agp,
                             "bos_token": bos, "eos_token": eos}
                variables.update(extra)
                try:
                    text, kind = tpl.render(**variables), "out"
                except TemplateError as e:
                    text, kind = str(e), "err"
                base = os.path.join(cases_dir, "%s.%s" % (name, cname))
                with open(base + ".json", "w", encoding="utf-8") as fh:
                    json.dump(variables, fh, ensure_ascii=False, indent=1)
                with open(base + "." + kind, "w", encoding="utf-8", newline="") as fh:
                    fh.write(text)
                index.append("%s %s %s" % (name, cname, kind))
    with open(os.path.join(OUT, "index.txt"), "w") as fh:
        fh.write("\n".join(index) + "\n")
    n_err = sum(1 for line in index if line.endswith("err"))
    print("%d templates, %d cases (%d raise an error), jinja2 %s" %
          (len(templates), len(index), n_err, jinja2.__version__))


if __name__ == "__main__":
    sys.exit(main())
