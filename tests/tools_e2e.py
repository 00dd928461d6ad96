#!/usr/bin/env python3
"""tools_e2e.py — OpenAI tool calls of `cellm serve`, end to end with the
official `openai` client.

Two servers, started by the cellm under test ($CELLM_BIN) through
e2e_common.py:
- SmolLM2 (real model, store). Its template has no tool support, so the
  generic system prompt renders the tools. A tool round trip: a call
  forced by naming the function (the grammar makes it valid), the tool's
  result sent back as a `role: "tool"` message, and a final answer; the
  same call streamed (tool_calls deltas through openai's stream API); and
  hostile tool lists (1,000 functions, bad schemas, missing names), each a
  400 that names the problem, with the server healthy after.
- The Qwen 2 random-weight fixture (tests/data/arch/qwen2, converted here)
  under the real Qwen 2.5 chat template (tests/data/templates), which
  renders `tools`, tool_calls and tool results itself: random weights
  write garbage, so calls are forced with tool_choice "required" and a
  named function; the round trip's final turn checks that the tool turns
  render and the reply comes back as content.

Run by ctest (tests/*_e2e.py); by hand:
    CELLM_BIN=build/cellm python3 tests/tools_e2e.py
"""
import json
import os
import subprocess
import tempfile

from e2e_common import (HERE, KEY, MODEL_ID, cellm_bin, check, openai, run, start_server,
                        stop_server)

TEST = "tools_e2e"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def named(name):
    return {"type": "function", "function": {"name": name}}


def check_call(msg, finish, name, what):
    """One valid call of `name` in a whole reply; returns it."""
    check(finish == "tool_calls", f"{what}: finish_reason {finish}")
    calls = msg.tool_calls or []
    check(len(calls) == 1, f"{what}: {len(calls)} calls ({msg})")
    c = calls[0]
    check(c.type == "function" and c.id.startswith("call_"), f"{what}: call {c}")
    check(c.function.name == name, f"{what}: called {c.function.name}")
    args = json.loads(c.function.arguments)
    check(isinstance(args, dict) and isinstance(args.get("city"), str), f"{what}: args {args}")
    if name == "get_weather":
        check(args["city"] in ("Paris", "Tokyo", "Lima"), f"{what}: city {args}")
    return c


def round_trip(client, model, first_choice, final_choice, what, real=True):
    """Call, tool result, final answer (some text; random weights may write
    only white space)."""
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice=first_choice, parallel_tool_calls=False,
                                       max_tokens=400)
    ch = r.choices[0]
    if ch.finish_reason != "tool_calls":
        print(f"     {what}: {ch.message}")
    call = check_call(ch.message, ch.finish_reason, first_choice["function"]["name"]
                      if isinstance(first_choice, dict) else "get_weather", what)
    result = json.dumps({"city": json.loads(call.function.arguments)["city"],
                         "temperature": 18, "sky": "sunny"})
    msgs = ASK + [ch.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                   "content": result}]
    r2 = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, TIME],
                                        tool_choice=final_choice, max_tokens=24)
    ch2 = r2.choices[0]
    check(ch2.finish_reason in ("stop", "length"), f"{what} answer: finish {ch2.finish_reason}")
    check(not ch2.message.tool_calls, f"{what} answer: calls again {ch2.message.tool_calls}")
    check(isinstance(ch2.message.content, str) and (ch2.message.content.strip() or not real),
          f"{what} answer: content {ch2.message.content!r}")
    # The call and the result are in the prompt: it grew by at least the
    # result's text.
    check(r2.usage.prompt_tokens > r.usage.prompt_tokens + 10,
          f"{what}: prompt {r.usage.prompt_tokens} -> {r2.usage.prompt_tokens} tokens")
    return ch2.message.content


def stream_call(client, model, **kw):
    """A streamed call: deltas as OpenAI sends them, put back together."""
    calls, finish, first = {}, None, {}
    for chunk in client.chat.completions.create(model=model, stream=True, **kw):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                if d.index not in calls:
                    # The first delta of a call has its id, type and name.
                    first[d.index] = d
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:
                    check(d.id is None and d.function.name is None,
                          "later deltas carry arguments only")
                calls[d.index]["arguments"] += d.function.arguments or ""
            if c.finish_reason:
                finish = c.finish_reason
    check(finish == "tool_calls", f"stream: finish_reason {finish}")
    check(sorted(calls) == list(range(len(calls))) and calls, f"stream: indexes {sorted(calls)}")
    for i, d in first.items():
        check(d.id and d.id.startswith("call_") and d.type == "function" and d.function.name,
              f"stream: first delta {d}")
    return [dict(c, arguments=json.loads(c["arguments"])) for _, c in sorted(calls.items())]


def test_smollm2_round_trip(client, base):
    answer = round_trip(client, MODEL_ID, named("get_weather"), "auto", "smollm2")
    print(f"     final answer: {answer[:70]!r}")


def test_smollm2_stream(client, base):
    calls = stream_call(client, MODEL_ID, messages=ASK, tools=[WEATHER], tool_choice="required",
                        parallel_tool_calls=False, max_tokens=120)
    check(len(calls) == 1 and calls[0]["name"] == "get_weather", f"stream: {calls}")
    check(calls[0]["arguments"].get("city") in ("Paris", "Tokyo", "Lima"), f"stream: {calls}")


def test_asan_hostile(client, base):
    """Bad tool lists are 400s naming the problem; the server stays up."""
    many = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
            for i in range(1000)]
    bad_schema = {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}
    cases = [
        (dict(tools=many), "at most"),
        (dict(tools=[bad_schema]), "$ref"),
        (dict(tools=[{"type": "function", "function": {"parameters": {}}}]), "name"),
        (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "name"),
        (dict(tools=[WEATHER, WEATHER]), "repeats"),
        (dict(tools=[WEATHER], tool_choice=named("nope")), "nope"),
        (dict(tool_choice="required"), "tools"),
        (dict(tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
        (dict(tools="get_weather"), "array"),
        (dict(tools=[WEATHER], parallel_tool_calls="yes"), "boolean"),
        (dict(tools=[WEATHER], tool_choice="required",
              response_format={"type": "json_object"}), "response_format"),
    ]
    for bad, word in cases:
        try:
            client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=4, **bad)
            check(False, f"accepted: {str(bad)[:80]}")
        except openai.BadRequestError as e:
            msg = e.body.get("message", "") if isinstance(e.body, dict) else ""
            check(word in msg, f"{str(bad)[:60]}: message {msg!r} lacks {word!r}")
    bad_turns = [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "x"}]}],
        [{"role": "user", "content": "hi", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
        [{"role": "tool", "content": 5}],
    ]
    for msgs in bad_turns:
        try:
            client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=4)
            check(False, f"accepted messages {msgs}")
        except openai.BadRequestError:
            check(True, "")
    # Healthy after: an ordinary request still works.
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=4)
    check(r.choices[0].message.content is not None, "a request after the bad ones")


def test_qwen_fixture(client, base):
    """The Qwen 2.5 template on the converted Qwen 2 fixture: forced calls."""
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "qwen2.gguf")
        r = subprocess.run([cellm_bin(TEST), "convert", os.path.join(HERE, "data", "arch", "qwen2"),
                            model, "--type", "f16"], capture_output=True, text=True)
        check(r.returncode == 0, f"cellm convert qwen2: {r.stderr.strip()}")
        with open(os.path.join(HERE, "data", "templates", "qwen25.jinja")) as f:
            tpl = f.read()
        proc, qbase = start_server(TEST, ["--api-key", KEY, "--alias", "qwen2", "-c", "2048",
                                          "-t", "2", "--temp", "0", "--chat-template", tpl],
                                   model=model)
        try:
            qwen = openai.OpenAI(base_url=qbase + "/v1", api_key=KEY, max_retries=0, timeout=120)
            round_trip(qwen, "qwen2", "required", "none", "qwen2 required", real=False)
            r = qwen.chat.completions.create(model="qwen2", messages=ASK, tools=[WEATHER, TIME],
                                             tool_choice=named("get_time"),
                                             parallel_tool_calls=False, max_tokens=120)
            check_call(r.choices[0].message, r.choices[0].finish_reason, "get_time",
                       "qwen2 named")
            calls = stream_call(qwen, "qwen2", messages=ASK, tools=[WEATHER, TIME],
                                tool_choice="required", max_tokens=400)
            check(all(c["name"] in ("get_weather", "get_time") for c in calls),
                  f"qwen2 stream {calls}")
        finally:
            stop_server(proc, TEST)


if __name__ == "__main__":
    run(TEST, [("test_smollm2_round_trip", test_smollm2_round_trip),
               ("test_smollm2_stream", test_smollm2_stream),
               ("test_asan_hostile", test_asan_hostile),
               ("test_qwen_fixture", test_qwen_fixture)])
