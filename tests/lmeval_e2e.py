#!/usr/bin/env python3
"""lmeval_e2e.py — `cellm serve` answers lm-evaluation-harness's
multiple-choice requests the way the harness reads them.

The harness itself (lm-eval and the datasets/pyarrow/pandas/scikit-learn
it pulls in, hundreds of MB) is too big for CI's setup; the full runs
against it and llama.cpp are scripts/lmeval_compare.py's (docs/serve.md,
docs/benchmarks.md). This test sends the request its `local-completions`
model sends to score a choice (echo, logprobs 1, max_tokens 1,
temperature 0, the text of context + continuation) and applies its rule:
the choice's log-likelihood is the sum of token_logprobs[ctxlen:-1], ctxlen
the context's token count, the final item being the generated token. On
questions of tests/data/lmeval/mc.jsonl it checks that:

- the rule gives what cellm itself says of the continuation: the sum of
  its log-probabilities from a max_tokens 0 echo (no generated item),
  and of a token-id prompt, bit for bit;
- the final item is there even when the model's next token is EOS
  (forced by logit_bias; the values are the model's own, before the bias):
  without it the harness drops the continuation's last token;
- with a model that puts a BOS before text (Gemma 3) the echo lists the
  text's own tokens, as many as /tokenize gives without special tokens
  (the BOS left out, else every ctxlen is one token off), with the values
  a token-id prompt starting with the BOS gets.

The sanitizer builds (CELLM_TEST_FILTER=test_?san_*) run only the EOS
case, which goes through the engine's reporting; the others are release
only.

Run by ctest (tests/*_e2e.py); by hand:
    CELLM_BIN=build/cellm python3 tests/lmeval_e2e.py
"""
import json
import math
import os
import time

from e2e_common import HERE, KEY, check, model_path, post, selected, start_server, stop_server
import e2e_common

WHO = "lmeval_e2e"


class Server:
    """`cellm serve` on one model (SmolLM2 when model is None), its id alias."""

    def __init__(self, model, alias):
        self.alias = alias
        self.proc, self.base = start_server(
            WHO, ["--api-key", KEY, "--alias", alias, "-c", "512", "-t", "2"], model)

    def post(self, path, body):
        return post(self.base, path, body)

    def tokenize(self, text):
        return self.post("/tokenize", {"content": text, "add_special": False})["tokens"]

    def score(self, prompt, **extra):
        """The harness's request for one choice; returns choices[0]."""
        body = {"model": self.alias, "prompt": prompt, "temperature": 0, "max_tokens": 1,
                "logprobs": 1, "seed": 1234, "echo": True}
        body.update(extra)
        return self.post("/v1/completions", body)["choices"][0]

    def stop(self):
        stop_server(self.proc, WHO)


def choices(server, n_questions, n_choices):
    """(context, context + continuation, the context's token count) for
    the first choices of the first questions, as the task forms them."""
    with open(os.path.join(HERE, "data", "lmeval", "mc.jsonl")) as f:
        docs = [json.loads(line) for line in f][:n_questions]
    for d in docs:
        ctx = f"Question: {d['question']}\nAnswer:"
        ctxlen = len(server.tokenize(ctx))
        for c in d["choices"][:n_choices]:
            yield ctx, ctx + " " + c, ctxlen


def harness_ll(choice, ctxlen):
    """local-completions' parse: the continuation's sum, without the last
    (generated) item; and whether each token was the likeliest."""
    lp = choice["logprobs"]
    vals, tops = lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1]
    greedy = all(v == max(t.values()) for v, t in zip(vals, tops))
    return sum(vals), greedy


def test_choices(s):
    """SmolLM2 (no BOS): the harness's sum against cellm's own values."""
    for ctx, text, ctxlen in choices(s, 2, 2):
        ids = s.tokenize(text)
        check(ids[:ctxlen] == s.tokenize(ctx), f"{text!r}: the context's tokens begin the whole")
        r = s.score(text)
        lp = r["logprobs"]["token_logprobs"]
        check(len(lp) == len(ids) + 1, f"{text!r}: {len(lp)} items for {len(ids)} tokens + 1")
        check(r["text"].startswith(text), "echo text")
        ll, _ = harness_ll(r, ctxlen)
        check(math.isfinite(ll) and ll < 0, f"{text!r}: log-likelihood {ll}")
        alone = s.score(text, max_tokens=0)["logprobs"]["token_logprobs"]
        check(len(alone) == len(ids), "max_tokens 0: the prompt's items alone")
        check(ll == sum(alone[ctxlen:]), f"{text!r}: {ll} != cellm's own {sum(alone[ctxlen:])}")
        by_ids = s.score(ids)["logprobs"]["token_logprobs"]
        check(by_ids == lp, f"{text!r}: a token-id prompt scores the same")


def test_asan_eos_next(s):
    """The generated item is there when it is EOS, with the model's value."""
    info = s.post("/tokenize", {"content": "<|im_end|>", "add_special": False,
                                "parse_special": True})["tokens"]
    check(len(info) == 1, "SmolLM2's end of turn is one token")
    eos = info[0]
    text = "Question: Which planet do we live on?\nAnswer: Earth"
    ctxlen = len(s.tokenize("Question: Which planet do we live on?\nAnswer:"))
    n = len(s.tokenize(text))
    plain = s.score(text)
    forced = s.score(text, logit_bias={str(eos): 100})
    check(forced["finish_reason"] == "stop", "the forced EOS stops the choice")
    check(forced["text"] == text, "nothing is generated after the echo")
    lp = forced["logprobs"]
    check(len(lp["token_logprobs"]) == n + 1, f"{len(lp['token_logprobs'])} items, want {n} + 1")
    check(lp["tokens"][-1] == "<|im_end|>", f"the last item is the stop token ({lp['tokens'][-1]!r})")
    v = lp["token_logprobs"][-1]
    check(math.isfinite(v) and v <= 0, f"the stop token's value {v}")
    check(harness_ll(forced, ctxlen)[0] == harness_ll(plain, ctxlen)[0],
          "the bias changes no log-probability")
    check(lp["text_offset"][-1] == len(text.encode()), "the stop token's offset is the text's end")


def test_bos(g):
    """Gemma 3 (BOS before text): echo lists the text's tokens only."""
    bos = g.post("/tokenize", {"content": "x", "add_special": True})["tokens"][0]
    check(g.post("/tokenize", {"content": "x", "add_special": False})["tokens"][0] != bos,
          "Gemma 3 adds a BOS")
    for _, text, ctxlen in choices(g, 2, 2):
        ids = g.tokenize(text)
        r = g.score(text)
        lp = r["logprobs"]
        check(len(lp["token_logprobs"]) == len(ids) + 1,
              f"{text!r}: {len(lp['token_logprobs'])} items for {len(ids)} tokens + 1")
        check(lp["tokens"][0] == "Question", f"the first item is the text's ({lp['tokens'][0]!r})")
        check(lp["text_offset"][0] == 0, "offsets count from the text's start")
        with_bos = g.score([bos] + ids)["logprobs"]["token_logprobs"]
        check(with_bos[0] is None, "a token prompt echoes all of its tokens")
        check(lp["token_logprobs"] == with_bos[1:], f"{text!r}: the values after the BOS")
        ll, _ = harness_ll(r, ctxlen)
        check(ll == sum(with_bos[1 + ctxlen:1 + len(ids)]), f"{text!r}: the continuation's sum")


def main():
    t0 = time.time()
    cases = [("test_choices", "smollm2", test_choices),
             ("test_asan_eos_next", "smollm2", test_asan_eos_next),
             ("test_bos", "gemma3", test_bos)]
    servers = {}
    try:
        for name, model, fn in cases:
            if not selected(name):
                continue
            if model not in servers:
                path = model_path(WHO, "gemma3-270m", "CELLM_TEST_GEMMA3") if model == "gemma3" else None
                servers[model] = Server(path, model)
            t = time.time()
            fn(servers[model])
            print(f"ok   {name} ({time.time() - t:.1f} s)", flush=True)
    finally:
        for s in servers.values():
            s.stop()
    print(f"{WHO}: {e2e_common.checks} checks passed in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
