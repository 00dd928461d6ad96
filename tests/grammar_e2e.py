#!/usr/bin/env python3
"""grammar_e2e.py — structured output of `cellm serve`, end to end with the
official `openai` client.

Starts the real `cellm` binary ($CELLM_BIN) with SmolLM2 on an ephemeral
loopback port and sends: JSON mode (`response_format` json_object),
llama-server's `grammar` field, a bad schema (a 400 naming it), and
`response_format` json_schema with `strict` on the 25 schemas of
tests/data/json_schemas.json (nested objects, arrays, enums, const,
anyOf/oneOf, patterns, bounds, $ref), three seeds each: every reply must
end by itself, parse, and validate with the `jsonschema` package. Then
SIGTERM and a clean exit.

The schema loop is the heavy part (75 requests, 8 at a time): it runs in
release builds only (its name is not test_tsan_* / test_asan_*, which are
what the sanitizer builds select with CELLM_TEST_FILTER).

Run by ctest (tests/*_e2e.py); by hand:
    CELLM_BIN=build/cellm python3 tests/grammar_e2e.py
"""
import concurrent.futures
import json
import os

from e2e_common import HERE, MODEL_ID, check, openai, require, run

jsonschema = require("grammar_e2e", "jsonschema")


def test_json_mode(client):
    """JSON mode gives one JSON object; `grammar` constrains a completion."""
    msgs = [{"role": "user", "content": "Describe a cat as JSON."}]
    r = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=120,
                                       temperature=0.8, seed=3,
                                       response_format={"type": "json_object"})
    c = r.choices[0]
    check(c.finish_reason == "stop", f"json_object finished by {c.finish_reason}")
    check(isinstance(json.loads(c.message.content), dict), f"json_object: {c.message.content!r}")
    r = client.completions.create(model=MODEL_ID, prompt="The year is", max_tokens=8,
                                  extra_body={"grammar": 'root ::= " " [12] [0-9]{3} "."'})
    text = r.choices[0].text
    check(len(text) == 6 and text[1:5].isdigit() and text.endswith("."), f"grammar: {text!r}")


def test_asan_refusals(client):
    """A bad schema or grammar is a 400 whose message names the problem."""
    msgs = [{"role": "user", "content": "hi"}]
    for kw, says in [
            (dict(response_format={"type": "json_schema",
                                   "json_schema": {"name": "x", "schema": {"type": "thing"}}}),
             "unknown type 'thing'"),
            (dict(extra_body={"grammar": "root ::= root \"a\""}), "left-recursive"),
            (dict(extra_body={"grammar": "root ::= \"a\" x\nx ::= \"b\" x"}), "never finish"),
            (dict(extra_body={"grammar": "root ::= (("}), "expected ')'"),
            (dict(extra_body={"grammar": "root ::= \"a\"",
                              "response_format": {"type": "json_object"}}), "not both"),
            (dict(response_format={"type": "xml"}), "not one of"),
            (dict(response_format={"type": "json_schema"}), "needs 'json_schema'"),
            (dict(response_format={"type": "json_schema", "json_schema": {"schema": {
                "$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}}), "left-recursive"),
            (dict(response_format={"type": "json_schema", "json_schema": {"schema": {
                "$ref": "#/$defs/missing"}}}), "does not resolve")]:
        try:
            client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=4, **kw)
            check(False, f"{kw} was accepted")
        except openai.BadRequestError as e:
            check(says in str(e.body.get("message")), f"{kw}: {e.body}")


def test_json_schemas(client):
    with open(os.path.join(HERE, "data", "json_schemas.json")) as f:
        cases = json.load(f)
    check(len(cases) >= 25, "25 schemas")

    def one(case, seed):
        msgs = [{"role": "user", "content": case["prompt"] + " Answer in JSON."}]
        r = client.chat.completions.create(
            model=MODEL_ID, messages=msgs, max_tokens=200, temperature=0.8, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": case["name"], "schema": case["schema"],
                                             "strict": True}})
        return case, seed, r.choices[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(one, c, seed) for c in cases for seed in (1, 2, 3)]
        for j in jobs:
            case, seed, c = j.result()
            what = f"{case['name']} seed {seed}: {c.message.content!r}"
            check(c.finish_reason == "stop", f"{what} finished by {c.finish_reason}")
            try:
                value = json.loads(c.message.content)
            except ValueError:
                check(False, f"{what} is not JSON")
            try:
                jsonschema.validate(value, case["schema"])
            except jsonschema.ValidationError as e:
                check(False, f"{what} does not validate: {e.message}")


if __name__ == "__main__":
    run("grammar_e2e", [("test_asan_refusals", lambda c, b: test_asan_refusals(c)),
                        ("test_json_mode", lambda c, b: test_json_mode(c)),
                        ("test_json_schemas", lambda c, b: test_json_schemas(c))])
