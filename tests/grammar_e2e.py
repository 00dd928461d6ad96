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
import fnmatch
import json
import os
import signal
import subprocess
import sys
import time

try:
    import openai
except ImportError:
    sys.exit("grammar_e2e: the `openai` package is missing: pip install openai "
             "(scripts/setup.sh --test installs it)")
try:
    import jsonschema
except ImportError:
    sys.exit("grammar_e2e: the `jsonschema` package is missing: pip install jsonschema "
             "(scripts/setup.sh --test installs it)")

KEY = "grammar-e2e"
MODEL_ID = "smollm2"
HERE = os.path.dirname(os.path.abspath(__file__))
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


def model_path():
    p = os.environ.get("CELLM_TEST_SMOLLM2")
    if p:
        return p
    home = os.environ.get("CELLM_HOME") or os.path.join(os.environ["HOME"], ".cache", "cellm")
    p = os.path.join(home, "models", "smollm2-135m.gguf")
    if not os.path.exists(p):
        sys.exit(f"grammar_e2e: real model missing at {p}: run `cellm pull smollm2-135m`")
    return p


def start_server():
    binary = os.environ.get("CELLM_BIN")
    if not binary:
        sys.exit("grammar_e2e: CELLM_BIN is not set (ctest sets it)")
    cmd = [binary, "serve", model_path(), "--port", "0", "--api-key", KEY, "--alias", MODEL_ID,
           "-c", "1024", "-t", "2", "--temp", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        sys.exit(f"grammar_e2e: the server did not start ({line!r})")
    return proc, line.split()[-1]


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


def main():
    proc, base = start_server()
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)
        t0 = time.time()
        only = os.environ.get("CELLM_TEST_FILTER")
        for name, fn in [("test_asan_refusals", lambda: test_asan_refusals(client)),
                         ("test_json_mode", lambda: test_json_mode(client)),
                         ("test_json_schemas", lambda: test_json_schemas(client))]:
            if only and not fnmatch.fnmatch(name, only):
                continue
            t = time.time()
            fn()
            print(f"ok   {name} ({time.time() - t:.1f} s)", flush=True)
        print(f"grammar_e2e: {checks} checks passed in {time.time() - t0:.1f} s "
              f"(openai {openai.__version__})")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 60 s"
    if rc != 0:
        sys.exit(f"grammar_e2e: the server exited with {rc} on SIGTERM")


if __name__ == "__main__":
    main()
