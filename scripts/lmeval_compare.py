#!/usr/bin/env python3
"""lm-evaluation-harness against `cellm serve` and against llama.cpp's
OpenAI-compatible server (llama-cpp-python[server]) on the same GGUF file,
and llama.cpp against itself, to see whether cellm's scores lie within the
two engines' numerical spread.

For each model it runs the harness's `local-completions` model on the
multiple-choice task tests/data/lmeval/cellm_mc.yaml (60 questions, 4
choices: 240 scored continuations), with --log_samples, three times:

  cellm      cellm serve (its default batch, -b 256)
  llama      llama-cpp-python's server, n_batch 512 (its default)
  llama-b1   the same server with n_batch 1: the prompt one token at a time

and reports each run's acc and acc_norm, and for the pairs cellm/llama
and llama/llama-b1 the per-choice log-likelihood differences (max, mean,
median of |a - b| over the 240 choices) and the questions whose chosen
answer differs (by acc's argmax, and by acc_norm's). llama/llama-b1 is the
spread of llama.cpp itself: the same weights, batch shapes alone changed.

Before any scoring it checks that the harness's tokenizer (built from the
GGUF by scripts/gguf_hf_tokenizer.py; lm-eval needs one to count context
tokens) gives, for every context and context + continuation, the token
ids both servers give.

llama-cpp-python 0.3.36's echo log-probabilities are one position off for
a model that adds no BOS (SmolLM2): it scores the token at position i with
the logits *after* it, and leaves out the last. So for such a model the
runs serve a copy of the file with tokenizer.ggml.add_bos_token set (the
same copy to both engines), and the script shows the misalignment on the
unchanged file (--no-probe skips that).

Needs the harness and the llama.cpp server, e.g. in a venv:
    python3 -m venv --system-site-packages ~/lmeval-env
    ~/lmeval-env/bin/pip install "lm-eval[api]==0.4.13" \\
        "llama-cpp-python[server]==0.3.36" transformers tokenizers gguf
(no torch: the harness's API models do not import it).

Usage (from anywhere; CELLM_BIN defaults to build/cellm):
    ~/lmeval-env/bin/python scripts/lmeval_compare.py [--models smollm2,gemma3]
        [--limit N] [--threads N] [--work DIR] [--json FILE]
"""
import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gguf_hf_tokenizer  # noqa: E402

TASK = "cellm_mc"
TASK_DIR = os.path.join(ROOT, "tests", "data", "lmeval")
MODELS = {
    "smollm2": "smollm2-135m-q8_0.gguf",
    "gemma3": "gemma3-270m.gguf",
}


def store_dir():
    home = os.environ.get("CELLM_HOME") or os.path.join(os.environ["HOME"], ".cache", "cellm")
    return os.path.join(home, "models")


def http_json(url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on 127.0.0.1, ready when /v1/models answers."""

    def __init__(self, name, cmd, port, log_path):
        self.name, self.port = name, port
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"lmeval_compare: {name} exited at start (log: {log_path})")
            try:
                http_json(self.base + "/v1/models", timeout=5)
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.time() > deadline:
                    self.stop()
                    sys.exit(f"lmeval_compare: {name} did not start in 180 s (log: {log_path})")
                time.sleep(0.5)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def cellm_server(gguf_path, alias, threads, log_path):
    binary = os.environ.get("CELLM_BIN") or os.path.join(ROOT, "build", "cellm")
    port = free_port()
    cmd = [binary, "serve", gguf_path, "--port", str(port), "--alias", alias, "-t", str(threads),
           "-c", "256"]
    return Server("cellm serve", cmd, port, log_path)


def llama_server_main(argv):
    """llama-cpp-python's server, with one change of speed only: its echo
    sorts the whole vocabulary in Python for every token to list the top
    `logprobs` (seconds per request on 2 cores, minutes with Gemma's 262k
    vocabulary); here the same entries come from numpy's partition. The
    log-probabilities themselves are untouched."""
    import runpy

    import llama_cpp.llama as L
    import numpy as np

    class Row:
        def __init__(self, a):
            self.a = a

    def fast_zip(*its):
        if (len(its) == 2 and isinstance(its[0], np.ndarray) and its[0].ndim == 1
                and its[1] == range(len(its[0]))):
            return Row(its[0])
        return zip(*its)

    def fast_sorted(it, key=None, reverse=False):
        if not (isinstance(it, Row) and reverse and key is None):
            return sorted(it, key=key, reverse=reverse)
        a = it.a
        k = min(64, len(a))  # > the 20 top_logprobs a request may ask for
        top = np.argpartition(-a, k - 1)[:k]
        return sorted(((a[i], int(i)) for i in top), reverse=True)

    L.zip, L.sorted = fast_zip, fast_sorted
    sys.argv = ["llama_cpp.server"] + argv
    runpy.run_module("llama_cpp.server", run_name="__main__")


def llama_server(gguf_path, alias, threads, n_batch, log_path):
    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--llama-server", "--model", gguf_path, "--model_alias", alias,
           "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
           "--n_threads_batch", str(threads), "--n_ctx", "256", "--n_batch", str(n_batch),
           "--n_ubatch", str(n_batch), "--logits_all", "true"]
    return Server(f"llama.cpp server (n_batch {n_batch})", cmd, port, log_path)


def lmeval_args(base_url, alias, tok_dir, out_dir, limit):
    """The harness's arguments: local-completions on the task's text
    prompts (tokenized_requests=False: the server tokenizes, as both do
    alike; llama-cpp-python takes no token-id prompts)."""
    args = [f"model={alias}", f"base_url={base_url}/v1/completions",
            "tokenizer_backend=huggingface", f"tokenizer={tok_dir}", "tokenized_requests=False",
            "num_concurrent=1", "max_retries=1"]
    cmd = ["--model", "local-completions", "--model_args", ",".join(args), "--include_path",
           TASK_DIR, "--tasks", TASK, "--log_samples", "--output_path", out_dir]
    if limit:
        cmd += ["--limit", str(limit)]
    return cmd


def harness_main(record_path, argv):
    """Runs lm_eval's own command line in this process, recording every
    reply it parses (the echo's log-probabilities, the token count it
    sent and its context length) to record_path; what the harness scores
    is unchanged."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    parse = LocalCompletionsAPI.parse_logprobs
    rec = open(record_path, "w")

    def recording(outputs, tokens=None, ctxlens=None, **kw):
        for out, ids, ctxlen in zip(outputs if isinstance(outputs, list) else [outputs], tokens,
                                    ctxlens):
            lp = out["choices"][0]["logprobs"]
            rec.write(json.dumps({"ids": ids, "ctxlen": ctxlen, "lp": lp["token_logprobs"],
                                  "last": lp["tokens"][-1]}) + "\n")
        rec.flush()
        return parse(outputs, tokens=tokens, ctxlens=ctxlens, **kw)

    LocalCompletionsAPI.parse_logprobs = staticmethod(recording)
    from lm_eval.__main__ import cli_evaluate
    sys.argv = ["lm_eval"] + argv
    cli_evaluate()


def lmeval_env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error")
    return env


def run_lmeval(base_url, alias, tok_dir, out_dir, limit, log_path):
    """Runs the harness; returns {doc_id: sample} from its samples file."""
    shutil.rmtree(out_dir, ignore_errors=True)
    t0 = time.time()
    os.makedirs(out_dir)
    record = os.path.join(out_dir, "replies.jsonl")
    cmd = [sys.executable, os.path.abspath(__file__), "--harness", record] + \
        lmeval_args(base_url, alias, tok_dir, out_dir, limit)
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=lmeval_env(), stdout=log,
                            stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"lmeval_compare: lm_eval failed ({rc}); log: {log_path}")
    files = glob.glob(os.path.join(out_dir, "**", f"samples_{TASK}_*.jsonl"), recursive=True)
    if len(files) != 1:
        sys.exit(f"lmeval_compare: want one samples file under {out_dir}, found {files}")
    samples = load_samples(files[0])
    with open(record) as f:
        replies = {tuple(r["ids"]): r for r in map(json.loads, f)}
    return samples, replies, time.time() - t0


def correct(samples, replies, tok):
    """Each choice's log-likelihood as the harness would score it had the
    server listed the generated token: a server that stops at EOS and
    leaves it out (llama-cpp-python) makes the harness's [ctxlen:-1] drop
    the continuation's last token. Returns (corrected samples, choices
    whose reply had no generated item); checks that the harness's own
    value is the sum it should be."""
    out, n_missing = {}, 0
    for k, s in samples.items():
        ll = []
        for i, c in enumerate(s["choices"]):
            ids = tuple(tok(s["context"] + " " + c, add_special_tokens=False).input_ids)
            r = replies[ids]
            lp = r["lp"]
            if len(lp) == len(ids):
                n_missing += 1
            elif len(lp) != len(ids) + 1:
                sys.exit(f"lmeval_compare: {len(lp)} echo items for {len(ids)} tokens")
            want = sum(lp[r["ctxlen"]:-1])
            if abs(want - s["ll"][i]) > 1e-4:
                sys.exit(f"lmeval_compare: the harness scored {s['ll'][i]}, the reply sums to {want}")
            ll.append(sum(lp[r["ctxlen"]:len(ids)]))
        t = dict(s, ll=ll)
        t["acc"] = float(picks(t)[0] == s["target"])
        t["acc_norm"] = float(picks(t)[1] == s["target"])
        out[k] = t
    return out, n_missing


def load_samples(path):
    out = {}
    with open(path) as f:
        for line in f:
            s = json.loads(line)
            out[s["doc_id"]] = {
                "choices": s["doc"]["choices"],
                "context": s["arguments"]["gen_args_0"]["arg_0"],
                "target": int(s["target"]),
                "ll": [float(r[0]) for r in s["filtered_resps"]],
                "acc": s["acc"],
                "acc_norm": s["acc_norm"],
            }
    return out


def argmax(v):
    return max(range(len(v)), key=lambda i: v[i])


def picks(sample):
    """The answers acc and acc_norm choose (acc_norm: per character of the
    choice, as lm-eval divides)."""
    ll = sample["ll"]
    norm = [x / len(c) for x, c in zip(ll, sample["choices"])]
    return argmax(ll), argmax(norm)


def accuracy(samples):
    n = len(samples)
    return (sum(s["acc"] for s in samples.values()) / n,
            sum(s["acc_norm"] for s in samples.values()) / n)


def compare(a, b):
    """Per-choice |ll_a - ll_b| statistics and the questions whose picks differ."""
    d, n_acc, n_norm = [], 0, 0
    for k in a:
        d += [abs(x - y) for x, y in zip(a[k]["ll"], b[k]["ll"])]
        pa, pb = picks(a[k]), picks(b[k])
        n_acc += pa[0] != pb[0]
        n_norm += pa[1] != pb[1]
    return {"max": max(d), "mean": statistics.fmean(d), "median": statistics.median(d),
            "n_choices": len(d), "argmax_acc": n_acc, "argmax_norm": n_norm, "n_questions": len(a)}


def margins(samples):
    """Each question's gap between its best and second-best choice (acc):
    a pair of runs can only disagree on questions whose gap is under their
    differences."""
    out = []
    for s in samples.values():
        ll = sorted(s["ll"], reverse=True)
        out.append(ll[0] - ll[1])
    return out


def task_strings(limit):
    """(context, continuation) pairs the task scores, as lm-eval forms them."""
    pairs = []
    with open(os.path.join(TASK_DIR, "mc.jsonl")) as f:
        for i, line in enumerate(f):
            if limit and i >= limit:
                break
            d = json.loads(line)
            ctx = f"Question: {d['question']}\nAnswer:"
            pairs += [(ctx, " " + c) for c in d["choices"]]
    return pairs


def check_tokenizer(tok_dir, cellm_base, llama_base, alias, limit):
    """The harness tokenizer's ids against both servers' for every context
    and context + continuation; and that the context's ids begin those of
    the whole (lm-eval cuts the continuation off at the context's count)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir)
    bos = tok.convert_tokens_to_ids(tok.bos_token) if tok.bos_token else None
    texts = sorted({t for ctx, cont in task_strings(limit) for t in (ctx, ctx + cont)})
    bad, prefix_bad = [], 0
    for t in texts:
        mine = tok(t, add_special_tokens=False).input_ids
        c = http_json(cellm_base + "/tokenize", {"content": t, "add_special": False})["tokens"]
        ll = http_json(llama_base + "/extras/tokenize", {"model": alias, "input": t})["tokens"]
        if ll and ll[0] == bos and (not mine or mine[0] != bos):
            ll = ll[1:]  # llama-cpp-python's endpoint adds the model's BOS
        if not (mine == c == ll):
            bad.append(t)
    for ctx, cont in task_strings(limit):
        a = tok(ctx, add_special_tokens=False).input_ids
        if tok(ctx + cont, add_special_tokens=False).input_ids[:len(a)] != a:
            prefix_bad += 1
    return len(texts), bad, prefix_bad


def bos_copy(src, work):
    """A copy of src that asks for a BOS (for llama-cpp-python's echo)."""
    import gguf
    dst = os.path.join(work, os.path.basename(src).replace(".gguf", "-bos.gguf"))
    st = os.stat(src)
    if not (os.path.exists(dst) and os.path.getsize(dst) == st.st_size
            and os.path.getmtime(dst) >= st.st_mtime):
        shutil.copyfile(src, dst + ".tmp")
        r = gguf.GGUFReader(dst + ".tmp", "r+")
        f = r.fields["tokenizer.ggml.add_bos_token"]
        f.parts[f.data[0]][0] = True
        r.data.flush()
        del r
        os.replace(dst + ".tmp", dst)
    return dst


def adds_bos(path):
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields.get("tokenizer.ggml.add_bos_token")
    return bool(f.contents()) if f is not None else r.fields["tokenizer.ggml.model"].contents() == "llama"


def probe_no_bos(path, alias, threads, work):
    """On a file without BOS: one prompt's echo log-probabilities from both
    servers; returns (max |diff| over its tokens, the two lists)."""
    p = "Question: What is the capital city of France?\nAnswer: Paris"
    body = {"model": alias, "prompt": p, "max_tokens": 1, "echo": True, "logprobs": 1,
            "temperature": 0}
    out = []
    with cellm_server(path, alias, threads, os.path.join(work, "probe-cellm.log")) as s:
        out.append(http_json(s.base + "/v1/completions", body)["choices"][0]["logprobs"])
    with llama_server(path, alias, threads, 512, os.path.join(work, "probe-llama.log")) as s:
        out.append(http_json(s.base + "/v1/completions", body)["choices"][0]["logprobs"])
    a, b = out[0]["token_logprobs"], out[1]["token_logprobs"]
    diffs = [abs(x - y) for x, y in zip(a, b) if x is not None and y is not None]
    return max(diffs), len(a), len(b), out


def run_model(name, args, work):
    src = os.path.join(store_dir(), MODELS[name])
    if not os.path.exists(src):
        sys.exit(f"lmeval_compare: {src} is missing: run `cellm pull` for it")
    mwork = os.path.join(work, name)
    os.makedirs(mwork, exist_ok=True)
    alias = name
    rep = {"model": name, "file": MODELS[name]}
    path = src
    if not adds_bos(src):
        if not args.no_probe:
            mx, na, nb, _ = probe_no_bos(src, alias, args.threads, mwork)
            rep["probe"] = {"max_diff": mx, "cellm_items": na, "llama_items": nb}
            print(f"[{name}] unchanged file, no BOS: one prompt's echo, cellm {na} items, "
                  f"llama-cpp-python {nb}; max |diff| {mx:.3f} (llama-cpp-python's echo is "
                  f"one position off without BOS)", flush=True)
        path = bos_copy(src, mwork)
        rep["served"] = os.path.basename(path) + ", add_bos_token set"
    else:
        rep["served"] = MODELS[name]
    tok_dir = os.path.join(mwork, "tokenizer")
    gguf_hf_tokenizer.write_dir(path, tok_dir)

    runs = {}

    def harness(key, srv, label):
        smp, rpl, t = run_lmeval(srv.base, alias, tok_dir, os.path.join(mwork, "out-" + key),
                                 args.limit, os.path.join(mwork, f"lmeval-{key}.log"))
        runs[key] = (smp, rpl)
        print(f"[{name}] {label}: {t:.0f} s", flush=True)

    with cellm_server(path, alias, args.threads, os.path.join(mwork, "cellm.log")) as c:
        with llama_server(path, alias, args.threads, 512, os.path.join(mwork, "llama.log")) as ll:
            n, bad, prefix_bad = check_tokenizer(tok_dir, c.base, ll.base, alias, args.limit)
            rep["tokenizer"] = {"strings": n, "mismatch": len(bad), "prefix_mismatch": prefix_bad}
            print(f"[{name}] tokenizer: {n} strings, {len(bad)} differ from a server's, "
                  f"{prefix_bad} contexts not a prefix of their whole", flush=True)
            if bad:
                sys.exit(f"lmeval_compare: the harness tokenizer differs on {bad[:3]}")
            harness("llama", ll, "llama.cpp n_batch 512")
        harness("cellm", c, "cellm")
    with llama_server(path, alias, args.threads, 1, os.path.join(mwork, "llama-b1.log")) as ll:
        harness("llama-b1", ll, "llama.cpp n_batch 1")

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir)
    fixed = {}
    rep["accuracy"], rep["missing_generated"] = {}, {}
    for k, (smp, rpl) in runs.items():
        fixed[k], miss = correct(smp, rpl, tok)
        rep["missing_generated"][k] = miss
        rep["accuracy"][k] = dict(zip(("acc", "acc_norm", "acc_fixed", "acc_norm_fixed"),
                                      accuracy(smp) + accuracy(fixed[k])))
    for a, b in (("cellm", "llama"), ("cellm", "llama-b1"), ("llama", "llama-b1")):
        rep[f"{a} vs {b}"] = compare(fixed[a], fixed[b])
    m = margins(fixed["llama"])
    rep["smallest_margin"] = min(m)
    rep["margins_under_0.1"] = sum(x < 0.1 for x in m)
    rep["command"] = "lm_eval " + " ".join(lmeval_args("http://127.0.0.1:PORT", alias, "TOKDIR",
                                                       "OUT", args.limit))
    return rep


PAIRS = ("cellm vs llama", "cellm vs llama-b1", "llama vs llama-b1")


def print_report(reps):
    print("\n| model (file served) | run | acc | acc_norm | acc, acc_norm with the generated "
          "token restored | replies without it |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in reps:
        for k, a in r["accuracy"].items():
            print(f"| {r['model']} ({r['served']}) | {k} | {a['acc']:.4f} | {a['acc_norm']:.4f} | "
                  f"{a['acc_fixed']:.4f}, {a['acc_norm_fixed']:.4f} | "
                  f"{r['missing_generated'][k]} |")
    print("\nPer-choice log-likelihoods (generated token restored):\n")
    print("| model | pair | max abs diff | mean | median | picks differ (acc / acc_norm) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in reps:
        for k in PAIRS:
            c = r[k]
            print(f"| {r['model']} | {k} | {c['max']:.4f} | {c['mean']:.4f} | {c['median']:.4f} | "
                  f"{c['argmax_acc']} / {c['argmax_norm']} of {c['n_questions']} |")
    for r in reps:
        print(f"\n[{r['model']}] {r[PAIRS[0]]['n_choices']} choices; smallest gap between the best "
              f"and second choice (llama.cpp): {r['smallest_margin']:.4f}; gaps under 0.1: "
              f"{r['margins_under_0.1']}")
        print(f"[{r['model']}] command: {r['command']}")


def main():
    if sys.argv[1:2] == ["--harness"]:
        harness_main(sys.argv[2], sys.argv[3:])
        return
    if sys.argv[1:2] == ["--llama-server"]:
        llama_server_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--limit", type=int, default=0, help="first N questions only")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of each server (1: a shared 2-core machine stalls llama.cpp's spinning threads)")
    ap.add_argument("--work", default="/tmp/cellm-lmeval")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--no-probe", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    reps = [run_model(m, args, args.work) for m in args.models.split(",")]
    print_report(reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reps, f, indent=1)


if __name__ == "__main__":
    main()
