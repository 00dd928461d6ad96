#!/usr/bin/env python3
"""Writes the chat-template parity fixtures under tests/data/templates/.

Every expected text comes from Hugging Face transformers itself:
PreTrainedTokenizerFast.apply_chat_template(conversation, tools=...,
add_generation_prompt=..., tokenize=False, **kwargs) on a tokenizer built
offline (a tiny word-level `tokenizers.Tokenizer` holding only the special
tokens, with the model's chat_template, bos_token and eos_token set), so the
fixtures include what apply_chat_template does around the Jinja render:
messages' None-valued keys dropped, reasoning fields aliased, `tools` and
`documents` passed as None when not given, the special tokens passed as
variables. tests/test_jinja.c renders the same templates with cellm's
interpreter and compares byte for byte; it needs no Python.

Templates are the public chat templates of the models below, kept as test
data in tests/data/templates/NAME.jinja (SmolLM2's is read from the GGUF in
the model store when it is there, and must equal the committed copy), plus
features.jinja, cellm's own template of the language features templates use.

Output:
  tests/data/templates/cases/NAME.CASE.json  the variables (a JSON object):
                                             what apply_chat_template was
                                             given, special tokens included
  tests/data/templates/cases/NAME.CASE.out   the rendered text, or
  tests/data/templates/cases/NAME.CASE.err   the message raise_exception gave, or
  tests/data/templates/cases/NAME.CASE.fail  what else transformers raised (an
                                             undefined value used, a type error)
  tests/data/templates/index.txt             "NAME CASE out|err|fail" lines
  fuzz/corpus/jinja/NAME                     each template, as a fuzzer seed

Usage: python3 scripts/gen_template_fixtures.py [--model PATH]
Needs: pip install transformers jinja2 gguf (no torch, no network)
"""
import argparse
import json
import os
import shutil
import sys

import jinja2
import tokenizers
import transformers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "templates")
SEEDS = os.path.join(ROOT, "fuzz", "corpus", "jinja")

# name: (bos_token, eos_token, conversation sets, variables every case gets,
#        where the template comes from)
TEMPLATES = {
    "smollm2": ("<|im_start|>", "<|im_end|>", ("base",), {},
                "HuggingFaceTB/SmolLM2-135M-Instruct (tokenizer.chat_template of the GGUF file)"),
    "gemma3": ("<bos>", "<eos>", ("base", "parts"), {}, "google/gemma-3-1b-it"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>", ("base",), {},
               "meta-llama/Meta-Llama-3-8B-Instruct"),
    "llama31": ("<|begin_of_text|>", "<|eot_id|>", ("base", "tools", "llama", "builtin"), {},
                "meta-llama/Llama-3.1-8B-Instruct"),
    # Without date_string the template prints today's date (strftime_now).
    "llama32": ("<|begin_of_text|>", "<|eot_id|>", ("base", "tools", "llama"),
                {"date_string": "02 Mar 2025"}, "meta-llama/Llama-3.2-3B-Instruct"),
    "qwen25": (None, "<|im_end|>", ("base", "tools"), {}, "Qwen/Qwen2.5-7B-Instruct"),
    "qwen3": (None, "<|im_end|>", ("base", "tools", "thinking"), {}, "Qwen/Qwen3-0.6B"),
    "mistral": ("<s>", "</s>", ("base", "tools"), {}, "mistralai/Mistral-7B-Instruct-v0.3"),
    "phi3": ("<s>", "<|endoftext|>", ("base",), {}, "microsoft/Phi-3-mini-4k-instruct"),
    "deepseek_r1_distill": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                            ("base", "tools", "thinking"), {},
                            "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"),
    "features": ("<B>", "<E>", ("base",), {}, "cellm: the language features, one by one"),
}

SYS = {"role": "system", "content": "You are a careful assistant."}
U1 = {"role": "user", "content": "Hello! How are you?"}
A1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
U2 = {"role": "user", "content": "Tell me a joke about C."}
A2 = {"role": "assistant", "content": "Why did the pointer cross the road? Undefined behaviour."}
U3 = {"role": "user", "content": "  Another one, please.  "}
SPECIAL = {"role": "user", "content":
           "  {{ not a tag }} {% neither %} {# nor #} 'quotes' \"double\" back\\slash\n"
           "\ttab <|im_end|> <end_of_turn> [INST] </s> & < >  \n\n"}
UNI = {"role": "user", "content":
       "\u00a0Ünïcödé: 日本語のテキスト, emoji 😀🎉, Ελληνικά, Кириллица, עברית\u3000"}
EMPTY_U = {"role": "user", "content": ""}
EMPTY_A = {"role": "assistant", "content": ""}
# Reasoning, three ways: inside the content, as reasoning_content (what the
# templates read), as `thinking` (which apply_chat_template aliases).
THINK_A = {"role": "assistant",
           "content": "<think>\nThe user greets me.\nBe kind.\n</think>\n\nI'm fine, thanks!"}
REASON_A = {"role": "assistant", "content": "I'm fine, thanks!",
            "reasoning_content": "\nThe user greets me; answer in kind.\n"}
THINKING_A = {"role": "assistant", "content": "Hi again.", "thinking": "A second greeting."}


def conversations():
    """(case, messages, variables) used for every template."""
    return [
        ("single", [U1], {}),
        ("system", [SYS, U1], {}),
        ("multi", [SYS, U1, A1, U2], {}),
        ("multi_nosys", [U1, A1, U2], {}),
        ("long", [SYS, U1, A1, U2, A2, U3], {}),
        ("ends_assistant", [SYS, U1, A1], {}),
        ("special", [SPECIAL], {}),
        ("unicode", [SYS, UNI, A1, UNI], {}),
        ("empty", [EMPTY_U, EMPTY_A, U2], {}),
        ("alternation", [U1, U2], {}),
        ("system_late", [U1, A1, SYS, U2], {}),
        ("think", [SYS, U1, THINK_A, U2], {}),
        ("think_last", [U1, THINK_A], {}),
        ("reasoning", [U1, REASON_A, U2], {}),
        ("reasoning_last", [SYS, U1, REASON_A], {}),
        ("thinking_field", [U1, THINKING_A, U2, THINKING_A], {}),
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
        "name": "noop", "description": "Does nothing",
        "parameters": {"type": "object", "properties": {}}}},
]


def call(content, *calls):
    m = {"role": "assistant", "content": content, "tool_calls": []}
    for cid, args in calls:
        m["tool_calls"].append({"id": cid, "type": "function",
                                "function": {"name": "get_weather", "arguments": args}})
    return m


def result(cid, text):
    return {"role": "tool", "tool_call_id": cid, "name": "get_weather", "content": text}


def tool_conversations():
    q = {"role": "user", "content": "Weather in Zürich?"}
    args = {"city": "Zürich", "days": 2}
    r1 = result("call12345", "{\"temp\": 21.5, \"sky\": \"clear\"}")
    final = {"role": "assistant", "content": "It is 21.5 °C and clear."}
    tools = {"tools": TOOLS}
    return [
        ("tools", [SYS, q], tools),
        ("tools_nosys", [q], tools),
        ("tool_calls", [q, call("", ("call12345", args)), r1], tools),
        ("tool_calls_null", [SYS, q, call(None, ("call12345", args)), r1, final, U2], tools),
        ("tool_calls_str", [q, call(None, ("call12345", json.dumps(args))), r1], tools),
        ("tool_calls_parallel",
         [q, call(None, ("call12345", args), ("call67890", {"city": "Bern"})), r1,
          result("call67890", "rain"), final], tools),
    ]


def llama_conversations():
    q = {"role": "user", "content": "Weather in Zürich?"}
    return [
        ("tools_in_system", [SYS, q], {"tools": TOOLS, "tools_in_user_message": False}),
        ("custom_tools", [q], {"custom_tools": TOOLS[:1]}),
        ("ipython", [q, call(None, ("call12345", {"city": "Zürich"})),
                     {"role": "ipython", "content": {"temp": 21.5}}], {"tools": TOOLS}),
    ]


def builtin_conversations():
    q = {"role": "user", "content": "Search the news."}
    search = {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "brave_search", "arguments": {"query": "news"}}}]}
    return [
        ("builtin", [SYS, q], {"builtin_tools": ["brave_search", "code_interpreter"]}),
        ("builtin_call", [q, search, {"role": "ipython", "content": "nothing new"}],
         {"builtin_tools": ["brave_search", "wolfram_alpha"]}),
    ]


def thinking_conversations():
    return [
        ("nothink", [U1], {"enable_thinking": False}),
        ("nothink_multi", [SYS, U1, THINK_A, U2], {"enable_thinking": False}),
        ("think_on", [U1], {"enable_thinking": True}),
    ]


def parts_conversations():
    sysp = {"role": "system", "content": [{"type": "text", "text": "Describe images briefly."}]}
    img = {"role": "user", "content": [{"type": "image", "url": "cat.png"},
                                       {"type": "text", "text": "  What is this?  "}]}
    return [
        ("parts", [sysp, img, A1, U2], {}),
        ("parts_nosys", [img], {}),
    ]


SETS = {"base": conversations, "tools": tool_conversations, "llama": llama_conversations,
        "builtin": builtin_conversations, "thinking": thinking_conversations,
        "parts": parts_conversations}


def make_tokenizer(template, bos, eos):
    """A tokenizer with no model behind it: enough for apply_chat_template."""
    vocab = {"<unk>": 0}
    for t in (bos, eos):
        if t:
            vocab.setdefault(t, len(vocab))
    core = tokenizers.Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    kw = {"eos_token": eos}
    if bos:
        kw["bos_token"] = bos
    return PreTrainedTokenizerFast(tokenizer_object=core, chat_template=template, **kw)


def render(tok, messages, agp, variables):
    """(kind, text): the rendered text, or what apply_chat_template raised."""
    extra = dict(variables)
    tools = extra.pop("tools", None)
    try:
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=agp,
                                       tokenize=False, **extra)
        return "out", text
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises TemplateError itself; its subclasses are
        # jinja2's own errors (an undefined value used, a syntax error).
        if type(e) is jinja2.exceptions.TemplateError:
            return "err", str(e)
        return "fail", "%s: %s" % (type(e).__name__, e)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        return "fail", "%s: %s" % (type(e).__name__, e)


def read_template(name):
    with open(os.path.join(OUT, name + ".jinja"), encoding="utf-8", newline="") as fh:
        return fh.read()


def smollm2_from_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/cellm/models/smollm2-135m.gguf"),
                    help="SmolLM2 GGUF whose template must equal tests/data/templates/smollm2.jinja")
    args = ap.parse_args()
    if os.path.exists(args.model) and smollm2_from_gguf(args.model) != read_template("smollm2"):
        sys.exit("smollm2.jinja differs from the template in %s" % args.model)

    cases_dir = os.path.join(OUT, "cases")
    if os.path.isdir(cases_dir):
        shutil.rmtree(cases_dir)
    os.makedirs(cases_dir)
    os.makedirs(SEEDS, exist_ok=True)
    index, kinds = [], {}
    for name in sorted(TEMPLATES):
        bos, eos, sets, always, _source = TEMPLATES[name]
        src = read_template(name)
        with open(os.path.join(SEEDS, name), "w", encoding="utf-8", newline="") as fh:
            fh.write(src)
        tok = make_tokenizer(src, bos, eos)
        for set_name in sets:
            for case, messages, extra in SETS[set_name]():
                variables = dict(always)
                variables.update(extra)
                for agp in (False, True):
                    cname = "%s_%s" % (case, "gen" if agp else "nogen")
                    kind, text = render(tok, messages, agp, variables)
                    # What the C test passes: everything apply_chat_template
                    # was given, the tokenizer's special tokens included.
                    fixture = dict(tok.special_tokens_map)
                    fixture.update({"messages": messages, "add_generation_prompt": agp})
                    fixture.update(variables)
                    base = os.path.join(cases_dir, "%s.%s" % (name, cname))
                    with open(base + ".json", "w", encoding="utf-8") as fh:
                        json.dump(fixture, fh, ensure_ascii=False, indent=1)
                    with open(base + "." + kind, "w", encoding="utf-8", newline="") as fh:
                        fh.write(text)
                    index.append("%s %s %s" % (name, cname, kind))
                    kinds[kind] = kinds.get(kind, 0) + 1
    with open(os.path.join(OUT, "index.txt"), "w") as fh:
        fh.write("\n".join(index) + "\n")
    print("%d templates, %d cases (%s), transformers %s, jinja2 %s" %
          (len(TEMPLATES), len(index), ", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items())),
           transformers.__version__, jinja2.__version__))


if __name__ == "__main__":
    sys.exit(main())
