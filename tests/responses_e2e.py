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
- a client that drops a stream has its generation cancelled;
- the errors a client sees: refused options (tools, previous_response_id,
  background), bad items, bad schemas, bad bodies, an unknown model.

Run by ctest (tests/*_e2e.py); by hand:
    CELLM_BIN=build/cellm python3 tests/responses_e2e.py
"""
import concurrent.futures
import json
import sys
import time

from e2e_common import MODEL_ID, check, openai, request, run

try:
    import jsonschema
except ImportError:
    sys.exit("responses_e2e: the `jsonschema` package is missing: pip install jsonschema "
             "(scripts/setup.sh --test installs it)")

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

    msg = refused("tools", "tools",
                  tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}])
    check("tools" in msg, f"the tools refusal says why: {msg}")
    msg = refused("previous_response_id", "previous_response_id", previous_response_id="resp_1")
    check("stores no responses" in msg, msg)
    refused("background", "background", background=True)
    refused("a function call output item", "input[0]",
            input=[{"type": "function_call_output", "call_id": "c", "output": "x"}])
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
                          ("test_asan_disconnect", test_asan_disconnect),
                          ("test_asan_errors", test_asan_errors)])
