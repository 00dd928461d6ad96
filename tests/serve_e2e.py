#!/usr/bin/env python3
"""serve_e2e.py — `cellm serve` end to end with the official `openai` client.

Starts the real `cellm` binary ($CELLM_BIN) on an ephemeral loopback port
with the real SmolLM2 model, then drives it only through the `openai`
package: the model list, chat and text completions whole and streamed,
n > 1, stop strings, seed reproducibility (also among concurrent requests),
log-probabilities (chat and completions, whole and streamed, echo),
usage counts checked against the server's own tokenizer, and the errors a
client sees. Stops the server with SIGTERM and requires a clean exit (under
ASan that includes no leaks).

Run by ctest (registered in CMakeLists.txt as serve_e2e); by hand:
    CELLM_BIN=build/cellm python3 tests/serve_e2e.py
"""
import concurrent.futures
import urllib.request

from e2e_common import KEY, MODEL_ID, check, openai, post, run


def n_tokens(base, text, add_special):
    return len(post(base, "/tokenize", {"content": text, "add_special": add_special})["tokens"])


def chat_stream(client, **kw):
    """Runs a streamed chat request; returns (texts by index, finish reasons, usage, chunks)."""
    texts, finish, usage, chunks = {}, {}, None, 0
    for ch in client.chat.completions.create(stream=True, **kw):
        chunks += 1
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            if c.delta.content:
                texts[c.index] = texts.get(c.index, "") + c.delta.content
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, usage, chunks


def test_models(client):
    ids = [m.id for m in client.models.list()]
    check(ids == [MODEL_ID], f"models: {ids}")
    check(client.models.retrieve(MODEL_ID).id == MODEL_ID, "models.retrieve")


def test_chat(client, base):
    system, user = "You are a helpful assistant.", "What is 2+2? Answer with a number."
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    r = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=32,
                                       temperature=0)
    c = r.choices[0]
    check(r.object == "chat.completion" and c.message.role == "assistant", "chat shape")
    check("4" in c.message.content, f"chat answer: {c.message.content!r}")
    check(c.finish_reason == "stop", f"chat finish_reason {c.finish_reason}")
    # The prompt, rendered as SmolLM2's ChatML template renders it.
    rendered = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n")
    want = n_tokens(base, rendered, True)
    check(r.usage.prompt_tokens == want, f"chat prompt_tokens {r.usage.prompt_tokens} != {want}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total")
    check(0 < r.usage.completion_tokens <= 32, "completion_tokens")

    texts, finish, usage, chunks = chat_stream(client, model=MODEL_ID, messages=msgs,
                                               max_tokens=32, temperature=0,
                                               stream_options={"include_usage": True})
    check(texts.get(0) == c.message.content, f"stream != whole: {texts} vs {c.message.content!r}")
    check(chunks > 3, f"stream came in {chunks} chunks")
    check(finish == {0: "stop"}, f"stream finish {finish}")
    check(usage is not None and usage.prompt_tokens == r.usage.prompt_tokens and
          usage.completion_tokens == r.usage.completion_tokens, f"stream usage {usage}")

    r = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_completion_tokens=3)
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3,
          "max_completion_tokens")


def test_completions(client, base):
    prompt = "The capital of France is"
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=5, temperature=0)
    c = r.choices[0]
    check(r.object == "text_completion", "completion shape")
    check("Paris" in c.text, f"completion text {c.text!r}")
    check(c.finish_reason == "length" and r.usage.completion_tokens == 5, "completion length")
    want = n_tokens(base, prompt, True)
    check(r.usage.prompt_tokens == want, f"completion prompt_tokens {r.usage.prompt_tokens}")

    text, finish, usage = "", None, None
    for ch in client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=5,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.usage is not None:
            usage = ch.usage
        for x in ch.choices:
            text += x.text
            finish = x.finish_reason or finish
    check(text == c.text, f"completion stream {text!r} != {c.text!r}")
    check(finish == "length" and usage.completion_tokens == 5, "completion stream end")

    # Token prompts and a batch of prompts.
    ids = post(base, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
    r2 = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=5, temperature=0)
    check(r2.choices[0].text == c.text, "token prompt")
    r3 = client.completions.create(model=MODEL_ID, prompt=[prompt, "1, 2, 3,"], max_tokens=5,
                                   temperature=0)
    check([x.index for x in r3.choices] == [0, 1] and r3.choices[0].text == c.text,
          "prompt batch")


def test_n(client):
    msgs = [{"role": "user", "content": "Write a short poem about the sea."}]
    r = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=12, n=3,
                                       temperature=1.0, seed=7)
    check(sorted(c.index for c in r.choices) == [0, 1, 2], "n=3 indices")
    check(len({c.message.content for c in r.choices}) > 1, "n=3 gives different choices")
    check(r.usage.completion_tokens <= 36, "n=3 usage")
    texts, finish, usage, _ = chat_stream(client, model=MODEL_ID, messages=msgs, max_tokens=12,
                                          n=2, temperature=1.0, seed=7,
                                          stream_options={"include_usage": True})
    check(sorted(finish) == [0, 1], f"n=2 stream finish {finish}")
    check(texts[0] == r.choices[0].message.content and texts[1] == r.choices[1].message.content,
          "n=2 stream matches the first two choices of n=3 with the same seed")
    check(usage.completion_tokens > 0, "n=2 stream usage")


def test_stop(client):
    r = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4,", max_tokens=30,
                                  temperature=0, stop=[" 8", "xyz"])
    t = r.choices[0].text
    check(r.choices[0].finish_reason == "stop", f"stop finish {r.choices[0].finish_reason}")
    check(t.endswith("7,") and "8" not in t, f"stop text {t!r}")
    text = ""
    for ch in client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4,", max_tokens=30,
                                        temperature=0, stop=" 8", stream=True):
        text += "".join(x.text for x in ch.choices)
    check(text == t, f"stop stream {text!r}")
    # In chat: a stop string taken from the middle of the greedy answer
    # ends the answer just before its first occurrence.
    msgs = [{"role": "user", "content": "Describe a cat in two sentences."}]
    full = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=40,
                                          temperature=0).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 4]
    check(len(full) > 20 and stop.strip(), f"chat answer to cut: {full!r}")
    r = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=40,
                                       temperature=0, stop=[stop])
    got = r.choices[0].message.content
    check(r.choices[0].finish_reason == "stop", f"chat stop finish {r.choices[0].finish_reason}")
    check(got == full[:full.index(stop)], f"chat stop {stop!r}: {got!r} from {full!r}")


def test_seed(client):
    kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a story."}],
              max_tokens=20, temperature=1.0, top_p=0.95)
    a = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    c = client.chat.completions.create(seed=99, **kw).choices[0].message.content
    check(a == b, f"same seed, same text: {a!r} vs {b!r}")
    check(a != c, "another seed, another text")
    # Batch invariance: the same seeded request among concurrent others.
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        futs = [ex.submit(client.chat.completions.create, seed=1234 if i % 2 == 0 else 500 + i,
                          **kw) for i in range(6)]
        outs = [f.result().choices[0].message.content for f in futs]
    check(all(outs[i] == a for i in range(0, 6, 2)), f"seeded text among concurrent requests")


def test_penalties(client, base):
    prompt = "The capital of France is"
    plain = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4,
                                      temperature=0).choices[0].text
    first = post(base, "/tokenize", {"content": plain, "add_special": False})["tokens"][0]
    banned = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4,
                                       temperature=0, logit_bias={str(first): -100})
    t = banned.choices[0].text
    ids = post(base, "/tokenize", {"content": t, "add_special": False})["tokens"]
    check(t and ids[0] != first, f"logit_bias -100 bans token {first}: {t!r}")
    # A frequency penalty breaks a repetition loop greedy decoding falls into.
    loop = "I like cats. I like cats. I like"
    a = client.completions.create(model=MODEL_ID, prompt=loop, max_tokens=24,
                                  temperature=0).choices[0].text
    b = client.completions.create(model=MODEL_ID, prompt=loop, max_tokens=24, temperature=0,
                                  frequency_penalty=1.5, presence_penalty=0.5).choices[0].text
    check(a.count("cat") > b.count("cat"), f"penalties: {a!r} vs {b!r}")


def check_content_logprobs(items, top, what):
    """OpenAI's choices[].logprobs.content items: values <= 0, `top`
    alternatives most likely first, bytes the token's UTF-8."""
    for it in items:
        check(it.logprob <= 0 and len(it.top_logprobs) == top, f"{what}: {it}")
        check(bytes(it.bytes) == it.token.encode(), f"{what}: bytes of {it.token!r}")
        lps = [t.logprob for t in it.top_logprobs]
        check(lps == sorted(lps, reverse=True), f"{what}: top_logprobs order {lps}")
        for t in it.top_logprobs:
            if t.token == it.token:
                check(t.logprob == it.logprob, f"{what}: {it.token!r} differs in its top list")


def test_logprobs(client):
    msgs = [{"role": "user", "content": "Name a colour."}]
    kw = dict(model=MODEL_ID, messages=msgs, max_tokens=8, logprobs=True, top_logprobs=4)
    r = client.chat.completions.create(**kw)
    items = r.choices[0].logprobs.content
    check(len(items) == r.usage.completion_tokens, f"one item per token: {len(items)}")
    check("".join(i.token for i in items) == r.choices[0].message.content, "tokens make the text")
    check_content_logprobs(items, 4, "chat")
    # Streamed: the same items, spread over the chunks.
    streamed = []
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            if c.logprobs and c.logprobs.content:
                streamed += c.logprobs.content
    check([(i.token, i.logprob) for i in streamed] == [(i.token, i.logprob) for i in items],
          "streamed logprobs equal the whole reply's")
    # Completions, echo + logprobs as lm-evaluation-harness's local-completions
    # scores a continuation: the prompt's values, the first None.
    ctx, cont = "The capital of France is", " Paris"
    r = client.completions.create(model=MODEL_ID, prompt=ctx + cont, max_tokens=1, echo=True,
                                  logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    check(r.choices[0].text.startswith(ctx + cont), "echo text")
    check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "first prompt token")
    check(len(lp.tokens) == r.usage.prompt_tokens + 1, f"tokens: {lp.tokens}")
    check(all(v <= 0 for v in lp.token_logprobs[1:]), "values <= 0")
    check(all(len(d) == 1 for d in lp.top_logprobs[1:]), "one alternative each")
    check(lp.tokens[-2] == " Paris", f"the continuation's token: {lp.tokens}")
    # lm-eval's reading: the continuation's value, and whether it is greedy.
    score = lp.token_logprobs[-2]
    greedy = score == max(lp.top_logprobs[-2].values())
    check(score < 0 and greedy, f"' Paris' after '{ctx}': {score}, greedy {greedy}")
    # max_tokens 0 (the prompt alone), streamed.
    toks, vals = [], []
    for ch in client.completions.create(model=MODEL_ID, prompt=ctx + cont, max_tokens=0,
                                        echo=True, logprobs=0, stream=True):
        for c in ch.choices:
            if c.logprobs:
                toks += c.logprobs.tokens
                vals += c.logprobs.token_logprobs
    check(toks == lp.tokens[:-1] and vals == lp.token_logprobs[:-1],
          "streamed echo values equal the whole reply's")


def test_errors(client, base):
    msgs = [{"role": "user", "content": "hi"}]
    for bad, exc in [(dict(max_tokens=-1), openai.BadRequestError),
                     (dict(temperature=7), openai.BadRequestError),
                     (dict(n=1000), openai.BadRequestError),
                     (dict(logprobs=True, top_logprobs=21), openai.BadRequestError),
                     (dict(model="gpt-4o"), openai.NotFoundError)]:
        kw = dict(model=MODEL_ID, messages=msgs, max_tokens=4)
        kw.update(bad)
        try:
            client.chat.completions.create(**kw)
            check(False, f"{bad} was accepted")
        except exc as e:
            check(isinstance(e.body, dict) and e.body.get("message"), f"{bad}: error body")
    wrong = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    try:
        wrong.models.list()
        check(False, "a wrong API key was accepted")
    except openai.AuthenticationError:
        check(True, "")
    long_prompt = "word " * 3000
    try:
        client.completions.create(model=MODEL_ID, prompt=long_prompt, max_tokens=4)
        check(False, "a prompt over the context was accepted")
    except openai.BadRequestError as e:
        check(e.code == "context_length_exceeded", f"context error code {e.code}")


def check_blocks_free(client, base):
    metrics = urllib.request.urlopen(urllib.request.Request(
        base + "/metrics", headers={"Authorization": "Bearer " + KEY})).read().decode()
    used = [l for l in metrics.splitlines() if l.startswith("cellm_kv_blocks_used ")]
    check(used == ["cellm_kv_blocks_used 0"], f"blocks after the tests: {used}")


if __name__ == "__main__":
    # CELLM_TEST_FILTER (a glob, as for the cmocka tests) runs a subset:
    # under TSan, test.sh runs only test_tsan_*.
    run("serve_e2e", [("test_models", lambda c, b: test_models(c)),
                      ("test_tsan_chat", test_chat),
                      ("test_completions", test_completions),
                      ("test_n", lambda c, b: test_n(c)),
                      ("test_stop", lambda c, b: test_stop(c)),
                      ("test_seed", lambda c, b: test_seed(c)),
                      ("test_penalties", test_penalties),
                      ("test_logprobs", lambda c, b: test_logprobs(c)),
                      ("test_asan_errors", test_errors)],
        after=check_blocks_free)
