#!/usr/bin/env python3
"""responses_e2e.py — the Responses API of `cellm serve` (POST /v1/responses),
end to end with the official `openai` client's `client.responses.create`.

Through tests/e2e_common.py, starts the real `cellm` binary with SmolLM2
and checks:
- a whole response: OpenAI's shape, its text equal to the chat endpoint's
  greedy text for the same prompt, usage equal to chat's, `input` as a
  string and as message items with input_text parts alike;
- a streamed one: the typed events in OpenAI's order with sequence numbers
  0, 1, 2, ..., the deltas concatenating to the final text, which equals
  the whole response's;
- `instructions` (a system message first) and the developer role;
- `max_output_tokens`: status "incomplete" for the reason
  "max_output_tokens", whole and streamed (response.incomplete);
- `text.format` json_schema (strict; replies validated with `jsonschema`)
  and json_object;
- function tools: a forced call (named, required) as a function_call item,
  the round trip (the call and its function_call_output back in `input`,
  then text, as chat reads the same conversation), and a streamed call
  event by event (output_item.added, function_call_arguments.delta and
  .done, output_item.done, response.completed);
- a client that drops a stream has its generation cancelled;
- the errors a client sees: refused options (built-in tools,
  previous_response_id, background), bad tools and items, bad schemas,
  bad bodies, an unknown model.

Run by ctest (tests/*_e2e.py); by hand:
    CELLM_BIN=build/cellm python3 tests/responses_e2e.py
"""
import concurrent.futures
import json
import time

from e2e_common import MODEL_ID, check, openai, request, require, run

jsonschema = require("responses_e2e", "jsonschema")

QUESTION = "What is the capital of France? Answer in one sentence."

EVENTS_OPEN = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added"]
EVENTS_CLOSE = ["response.output_text.done", "response.content_part.done",
                "response.output_item.done"]


def chat_text(client, messages, max_tokens):
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=max_tokens,
                                       temperature=0)
    return r.choices[0].message.content, r.usage


def stream_events(client, **kw):
    """A streamed response: (its events, the deltas joined)."""
    events = list(client.responses.create(model=MODEL_ID, stream=True, **kw))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return events, text


def check_events(events, text, last):
    types = [e.type for e in events]
    n = len(types)
    check(types[:4] == EVENTS_OPEN, f"opening events {types[:4]}")
    check(types[-4:] == EVENTS_CLOSE + [last], f"closing events {types[-4:]}")
    check(all(t == "response.output_text.delta" for t in types[4:-4]), f"middle events {types}")
    check([e.sequence_number for e in events] == list(range(n)), "sequence numbers 0..n-1")
    check(events[0].response.status == "in_progress" and events[0].response.output == [],
          "response.created carries the response in progress")
    done = events[-4]
    check(done.text == text, f"output_text.done {done.text!r} != deltas {text!r}")
    item_id = events[2].item.id
    check(item_id.startswith("msg_") and all(getattr(e, "item_id", item_id) == item_id
                                             for e in events), "one item id throughout")
    check(events[-2].item.content[0].text == text, "output_item.done text")
    final = events[-1].response
    check(final.output_text == text, "the final response's text is the deltas'")
    return final


def test_whole(client, base):
    msgs = [{"role": "user", "content": QUESTION}]
    want, usage = chat_text(client, msgs, 40)
    r = client.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=40,
                                temperature=0)
    check(r.object == "response" and r.id.startswith("resp_"), f"shape: {r.object} {r.id}")
    check(r.status == "completed" and r.incomplete_details is None, f"status {r.status}")
    check(r.model == MODEL_ID and r.created_at > 0, "model, created_at")
    check(len(r.output) == 1, f"{len(r.output)} output items")
    m = r.output[0]
    check(m.type == "message" and m.role == "assistant" and m.status == "completed" and
          m.id.startswith("msg_"), f"output item {m}")
    check(len(m.content) == 1 and m.content[0].type == "output_text" and
          m.content[0].annotations == [], f"content {m.content}")
    check(r.output_text == want, f"responses {r.output_text!r} != chat {want!r}")
    check("Paris" in r.output_text, f"answer {r.output_text!r}")
    u = r.usage
    check(u.input_tokens == usage.prompt_tokens and u.output_tokens == usage.completion_tokens and
          u.total_tokens == u.input_tokens + u.output_tokens, f"usage {u} vs chat {usage}")
    check(u.input_tokens_details.cached_tokens >= 0 and
          u.output_tokens_details.reasoning_tokens == 0, "usage details")
    # The same prompt as a message item with input_text parts.
    items = [{"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": QUESTION[:20]},
                          {"type": "input_text", "text": QUESTION[20:]}]}]
    r2 = client.responses.create(model=MODEL_ID, input=items, max_output_tokens=40,
                                 temperature=0)
    check(r2.output_text == want, f"item input {r2.output_text!r} != {want!r}")
    check(r2.id != r.id, "each response has its own id")
    # A multi-turn conversation: an assistant turn with output_text goes back in.
    conv = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
            {"role": "user", "content": QUESTION}]
    want3, _ = chat_text(client, [{"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "Hello!"},
                                  {"role": "user", "content": QUESTION}], 24)
    r3 = client.responses.create(model=MODEL_ID, input=conv, max_output_tokens=24,
                                 temperature=0)
    check(r3.output_text == want3, f"conversation {r3.output_text!r} != chat {want3!r}")


def test_stream(client, base):
    whole = client.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=40,
                                    temperature=0)
    events, text = stream_events(client, input=QUESTION, max_output_tokens=40, temperature=0)
    final = check_events(events, text, "response.completed")
    check(text == whole.output_text, f"stream {text!r} != whole {whole.output_text!r}")
    check(sum(e.type == "response.output_text.delta" for e in events) > 3, "several deltas")
    check(final.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens,
          f"final response {final.status} {final.usage}")
    # The SDK's stream helper, which rebuilds the response from the events.
    with client.responses.stream(model=MODEL_ID, input=QUESTION, max_output_tokens=40,
                                 temperature=0) as st:
        helper = "".join(e.delta for e in st if e.type == "response.output_text.delta")
        got = st.get_final_response()
    check(helper == whole.output_text and got.output_text == whole.output_text,
          f"responses.stream: {helper!r} / {got.output_text!r}")


def test_instructions(client, base):
    system = "You are a pirate. Answer like one."
    want, _ = chat_text(client, [{"role": "system", "content": system},
                                 {"role": "user", "content": QUESTION}], 30)
    r = client.responses.create(model=MODEL_ID, instructions=system, input=QUESTION,
                                max_output_tokens=30, temperature=0)
    check(r.output_text == want, f"instructions {r.output_text!r} != chat {want!r}")
    check(r.instructions == system, f"instructions echoed: {r.instructions!r}")
    r2 = client.responses.create(model=MODEL_ID, max_output_tokens=30, temperature=0,
                                 input=[{"role": "developer", "content": system},
                                        {"role": "user", "content": QUESTION}])
    check(r2.output_text == want, "a developer message is the system message")


def test_max_output_tokens(client, base):
    r = client.responses.create(model=MODEL_ID, input="Tell me a long story about a dragon.",
                                max_output_tokens=5, temperature=0)
    check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens",
          f"status {r.status} {r.incomplete_details}")
    check(r.usage.output_tokens == 5 and r.max_output_tokens == 5, f"usage {r.usage}")
    check(r.output[0].status == "incomplete", "the item is incomplete too")
    events, text = stream_events(client, input="Tell me a long story about a dragon.",
                                 max_output_tokens=5, temperature=0)
    final = check_events(events, text, "response.incomplete")
    check(final.status == "incomplete" and text == r.output_text, f"streamed: {final.status}")


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}, "maxItems": 2},
    },
    "required": ["name", "age", "colour", "pets"],
    "additionalProperties": False,
    "$defs": {"pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                      "required": ["kind"], "additionalProperties": False}},
}


def test_json(client, base):
    fmt = {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}
    r = client.responses.create(model=MODEL_ID, input="Describe a person as JSON.",
                                text={"format": fmt}, max_output_tokens=200, temperature=0.8,
                                extra_body={"seed": 1})
    check(r.status == "completed", f"json_schema status {r.status}")
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    check(r.text.format.type == "json_schema" and r.text.format.name == "person",
          f"text.format echoed: {r.text.format}")
    check(r.temperature == 0.8 and r.top_p == 1, f"sampling echoed: {r.temperature} {r.top_p}")
    # JSON mode: the chat endpoint's response_format json_object, token for token.
    ask = "Describe a cat as JSON."
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # batched together: half the time
        fr = pool.submit(client.responses.create, model=MODEL_ID, input=ask,
                         text={"format": {"type": "json_object"}}, max_output_tokens=120,
                         temperature=0.8, extra_body={"seed": 3})
        fc = pool.submit(client.chat.completions.create, model=MODEL_ID,
                         messages=[{"role": "user", "content": ask}], max_tokens=120,
                         temperature=0.8, seed=3, response_format={"type": "json_object"})
        r, c = fr.result(), fc.result()
    check(r.status == "completed", f"json_object status {r.status}")
    check(isinstance(json.loads(r.output_text), dict), f"json_object: {r.output_text!r}")
    check(r.output_text == c.choices[0].message.content, "json_object as chat's")


def metric(base, name):
    _, text = request(base, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_asan_disconnect(client, base):
    """A client that drops a stream has its generation cancelled."""
    stream = client.responses.create(model=MODEL_ID, input="Count from 1 to 1000.", stream=True,
                                     max_output_tokens=800, temperature=0)
    deltas = 0
    for e in stream:
        deltas += e.type == "response.output_text.delta"
        if deltas == 2:
            break
    stream.close()
    t0 = time.time()
    while metric(base, "cellm_requests_in_flight") or metric(base, "cellm_kv_blocks_used"):
        check(time.time() - t0 < 10, "the dropped stream's request was not cancelled in 10 s")
        time.sleep(0.05)
    check(True, "cancelled")


WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather of a city",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string",
                                                  "enum": ["Paris", "Tokyo", "Lima"]}},
                          "required": ["city"], "additionalProperties": False},
           "strict": True}
TIME = {"type": "function", "name": "get_time", "description": "The local time of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"], "additionalProperties": False}}
ASK = "What is the weather in Paris?"


def check_call(item, name, what):
    """A completed function_call output item of `name`; its arguments."""
    check(item.type == "function_call" and item.status == "completed", f"{what}: item {item}")
    check(item.id.startswith("fc_") and item.call_id.startswith("call_"), f"{what}: ids {item}")
    check(item.name == name, f"{what}: called {item.name}")
    args = json.loads(item.arguments)
    check(args.get("city") in ("Paris", "Tokyo", "Lima"), f"{what}: arguments {args}")
    return args


def test_tools(client, base):
    """A forced call (named; test_tools_stream forces with required), the round trip (the call and
    its output back in `input`, then an answer in text), tool_choice none."""
    r = client.responses.create(model=MODEL_ID, input=ASK, tools=[WEATHER, TIME],
                                tool_choice={"type": "function", "name": "get_weather"},
                                parallel_tool_calls=False, max_output_tokens=60)
    check(r.status == "completed", f"forced call: status {r.status}")
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1 and r.output[-1] is calls[0], f"one call, last: {r.output}")
    args = check_call(calls[0], "get_weather", "named")
    check(r.tool_choice.type == "function" and r.tool_choice.name == "get_weather"
          and not r.parallel_tool_calls, f"tool_choice echoed: {r.tool_choice}")
    check([t.name for t in r.tools] == ["get_weather", "get_time"] and r.tools[0].strict,
          f"tools echoed: {r.tools}")
    check(r.usage.output_tokens > 0 and r.output_text == "", f"usage {r.usage}")
    # The round trip: the reply's items and the function's output as input.
    result = json.dumps({"city": args["city"], "temperature": 18, "sky": "sunny"})
    items = [{"role": "user", "content": ASK}] + [o.model_dump(exclude_none=True)
                                                  for o in r.output]
    items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": result})
    r2 = client.responses.create(model=MODEL_ID, input=items, tools=[WEATHER, TIME],
                                 tool_choice="none", max_output_tokens=24)
    check(r2.status in ("completed", "incomplete") and [o.type for o in r2.output] == ["message"],
          f"answer: {r2.output}")
    check(r2.output_text.strip(), f"answer text {r2.output_text!r}")
    check(r2.usage.input_tokens > r.usage.input_tokens + 10,
          f"the call and its output are in the prompt: {r.usage.input_tokens} -> "
          f"{r2.usage.input_tokens} tokens")
    # The same conversation through chat, as chat's messages, reads the same.
    c = client.chat.completions.create(
        model=MODEL_ID, max_tokens=24, temperature=0, tools=[{"type": "function", "function": {
            k: v for k, v in t.items() if k != "type"}} for t in (WEATHER, TIME)],
        tool_choice="none", messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0].call_id, "type": "function", "function": {
                    "name": "get_weather", "arguments": calls[0].arguments}}]},
            {"role": "tool", "tool_call_id": calls[0].call_id, "content": result}])
    check(c.choices[0].message.content == r2.output_text and
          c.usage.prompt_tokens == r2.usage.input_tokens,
          f"as chat's: {c.choices[0].message.content!r} vs {r2.output_text!r}, "
          f"{c.usage.prompt_tokens} vs {r2.usage.input_tokens} tokens")


def test_tools_stream(client, base):
    """A streamed forced call, event by event, against the whole reply."""
    kw = dict(input=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
              max_output_tokens=60)
    whole = client.responses.create(model=MODEL_ID, **kw)
    events = list(client.responses.create(model=MODEL_ID, stream=True, **kw))
    types = [e.type for e in events]
    n = len(types)
    check(types[:3] == ["response.created", "response.in_progress", "response.output_item.added"],
          f"opening events {types[:3]}")
    check(types[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                         "response.completed"], f"closing events {types[-3:]}")
    check(n > 6 and all(t == "response.function_call_arguments.delta" for t in types[3:-3]),
          f"middle events {types}")
    check([e.sequence_number for e in events] == list(range(n)), "sequence numbers 0..n-1")
    added, done, item_done, final = events[2], events[-3], events[-2], events[-1].response
    check(added.item.type == "function_call" and added.item.arguments == "" and
          added.item.status == "in_progress" and added.output_index == 0,
          f"output_item.added {added}")
    deltas = "".join(e.delta for e in events[3:-3])
    check(all(e.item_id == added.item.id and e.output_index == 0 for e in events[3:-2]),
          "one item id and index throughout")
    check(done.arguments == deltas and item_done.item.arguments == deltas,
          f"arguments.done {done.arguments!r} != deltas {deltas!r}")
    check_call(item_done.item, "get_weather", "stream")
    check(item_done.item.call_id == added.item.call_id and item_done.item.name == added.item.name,
          "added and done describe one call")
    check(final.status == "completed" and len(final.output) == 1 and
          final.output[0].arguments == deltas, f"response.completed {final.output}")
    w = whole.output[0]
    check(w.arguments == deltas, f"the whole reply's call {w.arguments!r} equals the stream's")
    check(final.usage.output_tokens == whole.usage.output_tokens, "usage as the whole reply's")


def test_asan_errors(client, base):
    def refused(what, param, **kw):
        kw.setdefault("input", "Hi")
        kw.setdefault("max_output_tokens", 4)
        try:
            client.responses.create(model=MODEL_ID, **kw)
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.body.get("param") == param and e.body["message"],
                  f"{what}: {e.body}")
            return e.body["message"]
        raise AssertionError(f"{what} was accepted")

    msg = refused("a web_search tool", "tools[0]", tools=[{"type": "web_search"}])
    check("function tools" in msg, f"the built-in tool refusal says why: {msg}")
    refused("a nameless tool", "tools[0].name", tools=[{"type": "function", "parameters": {}}])
    msg = refused("chat's nested tool shape", "tools[0].name",
                  tools=[{"type": "function", "function": {"name": "f"}}])
    check("flat" in msg, f"the nested shape's refusal says why: {msg}")
    refused("parameters not an object", "tools[0].parameters",
            tools=[{"type": "function", "name": "f", "parameters": "x"}])
    refused("a bad tool_choice", "tool_choice", tools=[WEATHER],
            tool_choice={"type": "file_search"})
    msg = refused("an unknown function", "tool_choice", tools=[WEATHER],
                  tool_choice={"type": "function", "name": "nope"})
    check("nope" in msg, f"names the function: {msg}")
    refused("a call output without call_id", "input[1].call_id",
            input=[{"role": "user", "content": "x"}, {"type": "function_call_output", "output": "x"}])
    refused("a call without arguments", "input[0].arguments",
            input=[{"type": "function_call", "call_id": "c", "name": "f"}])
    refused("a reasoning item", "input[0]", input=[{"type": "reasoning", "summary": []}])
    msg = refused("previous_response_id", "previous_response_id", previous_response_id="resp_1")
    check("stores no responses" in msg, msg)
    refused("background", "background", background=True)
    refused("an image part", "input[0].content[0]",
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    refused("a bad role", "input[0].role", input=[{"role": "robot", "content": "x"}])
    refused("empty input", "input", input=[])
    refused("temperature out of range", "temperature", temperature=3)
    refused("max_output_tokens 0", "max_output_tokens", max_output_tokens=0)
    msg = refused("a bad schema", "text.format",
                  text={"format": {"type": "json_schema", "name": "x",
                                   "schema": {"type": "object", "properties":
                                              {"a": {"$ref": "#/$defs/missing"}}}}})
    check("missing" in msg, f"the schema error names the problem: {msg}")
    refused("a bad format type", "text.format.type", text={"format": {"type": "yaml"}})
    try:
        client.responses.create(model="no-such-model", input="Hi")
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "unknown model")
    for raw in [b"", b"{", b"[]", b'{"input": "\xff"}', b'{"input": "x"} 1']:
        status, reply = request(base, "/v1/responses", raw=raw)
        check(status == 400 and "error" in reply, f"{raw}: {status} {reply}")
    for body in [{"model": MODEL_ID}, {"input": 5}, {"input": "x", "text": "json"},
                 {"input": "x", "stream": "yes"}, {"input": [{"role": "user"}]},
                 {"input": [[]]}, {"input": "x", "tool_choice": "required"},
                 {"input": "x", "text": {"format": {"type": "json_schema", "schema": 1}}}]:
        status, reply = request(base, "/v1/responses", body)
        check(status == 400 and "error" in reply, f"{body}: {status} {reply}")
    # `store` and other options that change nothing are accepted.
    r = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=4, store=True,
                                metadata={"k": "v"}, reasoning={"effort": "low"})
    check(r.status in ("completed", "incomplete") and r.metadata == {"k": "v"},
          "store, metadata, reasoning accepted")


if __name__ == "__main__":
    run("responses_e2e", [("test_whole", test_whole),
                          ("test_tsan_stream", test_stream),
                          ("test_instructions", test_instructions),
                          ("test_max_output_tokens", test_max_output_tokens),
                          ("test_json", test_json),
                          ("test_tools", test_tools),
                          ("test_tools_stream", test_tools_stream),
                          ("test_asan_disconnect", test_asan_disconnect),
                          ("test_asan_errors", test_asan_errors)])
