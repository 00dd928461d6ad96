"""deploy_e2e.py — several `cellm serve` instances behind HAProxy with
deploy/haproxy.cfg (docs/deploy.md), on loopback.

test_asan_instance: one instance alone: /health, X-Request-Id passed
through or made, the affinity key (X-Session-Id, `user`, the prompt's first
tokens), the prefix-cache counters of /metrics, and the SIGTERM drain
(/health and new requests 503, the running request finishes, exit 0).

The others share three instances and HAProxy (deploy/haproxy.cfg plus a
round-robin frontend for comparison), each phase a bounded time of
concurrent clients having 3-turn chats over 8 shared system prompts:
  affinity_vs_round_robin: the prefix-cache hit rate (prompt tokens the
      cache gave over prompt tokens, summed over the instances' /metrics)
      through the round-robin frontend, then through the affine one (new
      system prompts each phase, so both start cold): affinity must be
      clearly higher, and each chat stays on one instance;
  failover_sigkill: one instance SIGKILLed mid-run, then restarted: every
      chat completes (a failed request is retried by HAProxy, or by the
      client when the error reaches it), nothing hangs;
  drain_sigterm: one instance SIGTERMed mid-run (it drains and exits 0),
      then restarted: no request fails at all.
DEPLOY_E2E_CLIENTS sets the clients (default 64, the issue's load: about
100 CPU-seconds a phase on two cores, 170 s in all on a quiet machine;
docs/deploy.md), DEPLOY_E2E_WORDS the words of each question (16),
DEPLOY_E2E_SECONDS each phase's
length (default 3: each client then has about one chat a phase). Each phase
prints the CPU time the instances spent, which bounds its time on an idle
machine from below (CPU-s / cores).
"""
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import e2e_common as ec

WHO = "deploy_e2e"
ROOT = os.path.dirname(ec.HERE)
PHASE_S = float(os.environ.get("DEPLOY_E2E_SECONDS", "3"))
CLIENTS = int(os.environ.get("DEPLOY_E2E_CLIENTS", "64"))
PROMPTS = 8
TURNS = 3
QUESTION_WORDS = int(os.environ.get("DEPLOY_E2E_WORDS", "16"))
INSTANCE_ARGS = ["-t", "1", "-c", "1024", "-np", "16", "--temp", "0", "--alias", ec.MODEL_ID,
                 "--log-requests", "--drain-timeout", "60"]

WORDS = ("river stone lantern harbor meadow copper violet engine garden winter signal "
         "orchard candle bridge falcon marble thunder pepper canyon glacier pocket ribbon "
         "saddle timber velvet whistle anchor basket cobalt dune ember fern").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port, method, path, body=None, headers=None, timeout=300):
    """One HTTP request: (status, headers dict (lower-case names), text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        h = {"Content-Type": "application/json", **(headers or {})}
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        c.close()


def metrics(port):
    """The instance's /metrics as {name-with-labels: value}."""
    _, _, text = call(port, "GET", "/metrics")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


class Instance:
    """One `cellm serve` on a fixed loopback port, its log in logdir."""

    def __init__(self, name, logdir, port=None, extra=()):
        self.name, self.port = name, port or free_port()
        self.log = os.path.join(logdir, name + ".log")
        self.extra = list(extra)
        self.proc = None

    def start(self):
        cmd = [ec.cellm_bin(WHO), "serve", ec.model_path(WHO), "--port", str(self.port),
               *INSTANCE_ARGS, *self.extra]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            sys.exit(f"{WHO}: {self.name} did not start ({line!r}); see {self.log}")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_haproxy(tmp, insts, bind, rr_bind, cfg=None):
    """HAProxy with deploy/haproxy.cfg (or cfg) and a round-robin frontend
    beside it."""
    rr = os.path.join(tmp, "rr.cfg")
    with open(rr, "w") as f:
        f.write('frontend cellm_rr\n    bind "${CELLM_RR_BIND}"\n    default_backend cellm_rr\n'
                "backend cellm_rr\n    balance roundrobin\n"
                "    http-response set-header X-Cellm-Server %s\n"
                "    option httpchk GET /health\n    http-check expect status 200\n"
                "    default-server check inter 1s fall 2 rise 2 maxconn 64\n")
        for i in range(len(insts)):
            f.write(f'    server cellm{i + 1} "${{CELLM_{i + 1}}}"\n')
    env = dict(os.environ, CELLM_LB_BIND=f"127.0.0.1:{bind}", CELLM_RR_BIND=f"127.0.0.1:{rr_bind}")
    for i, inst in enumerate(insts):
        env[f"CELLM_{i + 1}"] = f"127.0.0.1:{inst.port}"
    cfg = cfg or os.path.join(ROOT, "deploy", "haproxy.cfg")
    log = open(os.path.join(tmp, "haproxy.log"), "w")
    proc = subprocess.Popen(["haproxy", "-db", "-f", cfg, "-f", rr], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    return proc


def wait_up(port, what, timeout=30):
    """Until GET /health through `port` is 200."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            if call(port, "GET", "/health", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{WHO}: {what} not healthy after {timeout} s")


def system_prompt(tag, i):
    rnd = random.Random(f"{tag}-{i}")
    body = " ".join(rnd.choice(WORDS) for _ in range(12))
    return (f"[{tag} {i}] You are assistant number {i} of a help desk. Answer in one short "
            f"sentence. Notes for this desk: {body}.")


class Load:
    """CLIENTS threads chatting through `port` until `seconds` pass: each
    starts chats of TURNS turns over one of PROMPTS system prompts and
    always finishes the chat it has begun. A failed request (error status,
    reset, timeout) is retried by the client up to 5 times."""

    def __init__(self, port, tag, seconds, clients=CLIENTS):
        self.port, self.tag, self.end = port, tag, time.time() + seconds
        self.lock = threading.Lock()
        self.ok = self.client_retries = self.lost = self.completion_tokens = 0
        self.errors = []
        self.chat_servers = []  # per chat: the X-Cellm-Server of each turn
        self.threads = [threading.Thread(target=self.client, args=(k,), daemon=True)
                        for k in range(clients)]

    def request(self, body, headers):
        for attempt in range(6):
            try:
                st, h, text = call(self.port, "POST", "/v1/chat/completions", body, headers,
                                   timeout=120)
                if st == 200:
                    return h.get("x-cellm-server", "?"), json.loads(text)
                err = f"{st} {text[:120]}"
            except (OSError, http.client.HTTPException) as e:
                err = repr(e)
            with self.lock:
                self.errors.append(err)
                if attempt < 5:
                    self.client_retries += 1
            time.sleep(0.2)
        with self.lock:
            self.lost += 1
        return None, None

    def client(self, k):
        rnd = random.Random(f"{self.tag}-client-{k}")
        chat = 0
        while time.time() < self.end:
            sysp = system_prompt(self.tag, k % PROMPTS)
            msgs = [{"role": "system", "content": sysp}]
            servers = []
            for turn in range(TURNS):
                q = " ".join(rnd.choice(WORDS) for _ in range(QUESTION_WORDS))
                msgs.append({"role": "user", "content": f"Question {turn + 1}: {q}?"})
                srv, reply = self.request({"model": ec.MODEL_ID, "messages": msgs,
                                           "max_tokens": 4},
                                          {"X-Request-Id": f"{self.tag}-{k}-{chat}-{turn}"})
                if reply is None:
                    break
                servers.append(srv)
                msgs.append({"role": "assistant",
                             "content": reply["choices"][0]["message"]["content"]})
                with self.lock:
                    self.ok += 1
                    self.completion_tokens += reply["usage"]["completion_tokens"]
            with self.lock:
                self.chat_servers.append(servers)
            chat += 1

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def join(self):
        for t in self.threads:
            t.join(timeout=max(1.0, self.end - time.time()) + 90)
        hung = sum(t.is_alive() for t in self.threads)
        ec.check(hung == 0, f"{hung} clients still waiting 90 s after the phase's end")
        return self


def cpu_seconds(insts):
    """User + system CPU seconds of the instances running now."""
    total = 0.0
    for inst in insts:
        try:
            with open(f"/proc/{inst.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def cache_counts(insts):
    """(prompt tokens, cached prompt tokens) summed over the instances."""
    p = c = 0
    for inst in insts:
        m = metrics(inst.port)
        p += m["cellm_prompt_tokens_total"]
        c += m["cellm_prompt_cached_tokens_total"]
    return p, c


def hit_rate(insts, port, tag):
    p0, c0 = cache_counts(insts)
    cpu0 = cpu_seconds(insts)
    load = Load(port, tag, PHASE_S).start().join()
    p1, c1 = cache_counts(insts)
    load.cpu = cpu_seconds(insts) - cpu0
    ec.check(load.lost == 0 and load.ok > 0,
             f"{tag}: {load.ok} requests served, {load.lost} lost: {load.errors[:3]}")
    return (c1 - c0) / max(1.0, p1 - p0), load


# ---------------------------------------------------------------- one instance


def test_asan_instance(tmp):
    inst = Instance("single", tmp, extra=["--affinity-tokens", "8", "--drain-timeout", "30"])
    inst.start()
    try:
        port = inst.port
        st, h, text = call(port, "GET", "/health")
        ec.check(st == 200 and json.loads(text)["status"] == "ok", f"/health: {st} {text}")
        msgs = [{"role": "user", "content": "Name a colour of the sky on a clear day."}]
        body = {"messages": msgs, "max_tokens": 2}
        st, h, _ = call(port, "POST", "/v1/chat/completions", body, {"X-Request-Id": "req-42"})
        ec.check(st == 200 and h.get("x-request-id") == "req-42",
                 f"X-Request-Id not passed through: {st} {h}")
        st, h2, _ = call(port, "POST", "/v1/chat/completions", body)
        made = h2.get("x-request-id", "")
        ec.check(st == 200 and len(made) == 32 and made != "req-42", f"no id made: {h2}")
        st, h3, _ = call(port, "POST", "/v1/chat/completions", body,
                         {"X-Request-Id": "bad id\twith tab"})
        ec.check(st == 200 and " " not in h3.get("x-request-id", " "), f"bad id kept: {h3}")
        # The affinity key: X-Session-Id, then `user`, then the prompt's start.
        _, h, _ = call(port, "POST", "/v1/chat/completions", {**body, "user": "ann"},
                       {"X-Session-Id": "conv-9"})
        ec.check(h.get("x-cellm-affinity") == "session:conv-9", f"session key: {h}")
        _, h, _ = call(port, "POST", "/v1/chat/completions", {**body, "user": "ann"})
        ec.check(h.get("x-cellm-affinity") == "user:ann", f"user key: {h}")
        _, h, _ = call(port, "POST", "/v1/chat/completions", {**body, "user": "a b\u00e9"})
        ec.check(h.get("x-cellm-affinity", "").startswith("user:h"), f"odd user hashed: {h}")
        keys = []
        for tail in ("clear day.", "stormy night, please, in one word."):
            m = [{"role": "user", "content": "Name a colour of the sky on a " + tail}]
            _, h, _ = call(port, "POST", "/v1/chat/completions",
                           {"messages": m, "max_tokens": 1})
            keys.append(h.get("x-cellm-affinity", ""))
        m = [{"role": "user", "content": "Something else entirely, about rivers."}]
        _, h, _ = call(port, "POST", "/v1/chat/completions", {"messages": m, "max_tokens": 1})
        keys.append(h.get("x-cellm-affinity", ""))
        ec.check(keys[0].startswith("prefix:") and keys[0] == keys[1] and keys[2] != keys[0],
                 f"prefix keys (8 tokens): {keys}")
        _, h, _ = call(port, "POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1})
        ec.check(h.get("x-cellm-affinity", "").startswith("prefix:"), f"token prompt: {h}")
        # Hit counters: a repeated long prompt is taken from the cache.
        m0 = metrics(port)
        long_msgs = [{"role": "system", "content": system_prompt("asan", 0)},
                     {"role": "user", "content": "Hello?"}]
        for _ in range(2):
            st, _, _ = call(port, "POST", "/v1/chat/completions",
                            {"messages": long_msgs, "max_tokens": 1})
            ec.check(st == 200, "long prompt")
        m1 = metrics(port)
        cached = m1["cellm_prompt_cached_tokens_total"] - m0["cellm_prompt_cached_tokens_total"]
        hits = (m1['cellm_prefix_cache_requests_total{result="hit"}']
                - m0['cellm_prefix_cache_requests_total{result="hit"}'])
        ec.check(cached >= 32 and hits >= 1, f"prefix cache counters: cached {cached}, hits {hits}")
        ec.check(m1["cellm_ready"] == 1, "cellm_ready")
        # Every series the alert rules read is one the server exports.
        with open(os.path.join(ROOT, "deploy", "prometheus", "cellm_alerts.yml")) as f:
            used = set(re.findall(r"(?<![:\w])(cellm_[a-z_]+)(?![\w.])", f.read()))
        have = {k.split("{")[0] for k in m1}
        ec.check(used and used <= have, f"alert rules use unknown series: {used - have}")
        # The drain: a running request finishes, new ones get 503.
        result = {}

        def long_request():
            result["r"] = call(port, "POST", "/v1/completions",
                               {"prompt": "Once upon a time", "max_tokens": 48,
                                "stop": ["never stop here"]})
        t = threading.Thread(target=long_request)
        t.start()
        deadline = time.time() + 30
        while metrics(port)["cellm_requests_running"] < 1 and time.time() < deadline:
            time.sleep(0.02)
        inst.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        st = 200
        while st == 200 and time.time() < deadline:
            st, h, text = call(port, "GET", "/health")
        ec.check(st == 503 and json.loads(text)["status"] == "draining", f"draining: {st} {text}")
        st, h, text = call(port, "POST", "/v1/chat/completions", body)
        ec.check(st == 503 and json.loads(text)["error"]["code"] == "draining"
                 and h.get("connection") == "close" and h.get("retry-after") == "1",
                 f"a request while draining: {st} {h} {text}")
        t.join(timeout=60)
        st, _, text = result.get("r", (0, None, ""))
        ec.check(st == 200 and json.loads(text)["usage"]["completion_tokens"] == 48,
                 f"the running request did not finish: {st} {text[:200]}")
        rc = inst.proc.wait(timeout=30)
        ec.check(rc == 0, f"exit status after the drain: {rc}")
        with open(inst.log) as f:
            log = f.read()
        ec.check("request req-42 POST /v1/chat/completions 200" in log
                 and "affinity=session:conv-9" in log and "drained" in log,
                 f"the log lacks request ids, keys or the drain:\n{log[-1500:]}")
    finally:
        inst.kill()


# ---------------------------------------------------------------- the cluster


class Cluster:
    def __init__(self, tmp):
        self.tmp = tmp
        self.insts = [Instance(f"cellm{i + 1}", tmp) for i in range(3)]
        self.port, self.rr_port = free_port(), free_port()
        self.slow_port = free_port()
        self.haproxy = self.slow = None

    def __enter__(self):
        if not shutil.which("haproxy"):
            sys.exit(f"{WHO}: haproxy is missing: apt-get install haproxy "
                     "(scripts/setup.sh --test installs it)")
        for inst in self.insts:
            inst.start()
        self.haproxy = start_haproxy(self.tmp, self.insts, self.port, self.rr_port)
        wait_up(self.port, "HAProxy")
        wait_up(self.rr_port, "HAProxy (round robin)")
        # A second HAProxy of the same configuration whose health checks are
        # 30 s apart: what reaches a draining instance before the checks see
        # it must be retried by retry-on 503 and redispatch alone.
        slow_dir = os.path.join(self.tmp, "slow")
        os.makedirs(slow_dir, exist_ok=True)
        with open(os.path.join(ROOT, "deploy", "haproxy.cfg")) as f:
            cfg = f.read().replace("check inter 1s", "check inter 30s")
        slow_cfg = os.path.join(slow_dir, "haproxy.cfg")
        with open(slow_cfg, "w") as f:
            f.write(cfg)
        self.slow = start_haproxy(slow_dir, self.insts, self.slow_port, free_port(), slow_cfg)
        wait_up(self.slow_port, "HAProxy (slow checks)")
        return self  # HAProxy counts its servers up until checks fail

    def __exit__(self, *a):
        for h in (self.haproxy, self.slow):
            if h:
                h.kill()
                h.wait()
        for inst in self.insts:
            inst.kill()

    def restart(self, inst):
        inst.start()
        wait_up(inst.port, inst.name)


def test_affinity_vs_round_robin(cl):
    rr, rr_load = hit_rate(cl.insts, cl.rr_port, "rr")
    aff, aff_load = hit_rate(cl.insts, cl.port, "aff")
    sticky = [len(set(s)) == 1 for s in aff_load.chat_servers if len(s) == TURNS]
    rr_sticky = [len(set(s)) == 1 for s in rr_load.chat_servers if len(s) == TURNS]
    print(f"     prefix-cache hit rate: round robin {rr:.1%} ({rr_load.ok} requests, "
          f"{rr_load.cpu:.1f} CPU-s), affinity {aff:.1%} ({aff_load.ok} requests, "
          f"{aff_load.cpu:.1f} CPU-s); chats on one instance: "
          f"round robin {sum(rr_sticky)}/{len(rr_sticky)}, affinity "
          f"{sum(sticky)}/{len(sticky)}", flush=True)
    ec.check(len(sticky) >= 8 and sum(sticky) >= 0.9 * len(sticky),
             f"affine chats moved between instances: {sum(sticky)}/{len(sticky)}")
    ec.check(aff > rr + 0.15,
             f"affinity's hit rate {aff:.1%} is not clearly above round robin's {rr:.1%}")


def test_failover_sigkill(cl):
    victim = cl.insts[1]
    load = Load(cl.port, "kill", PHASE_S).start()
    time.sleep(PHASE_S / 3)
    victim.proc.kill()
    victim.proc.wait()
    killed_at = time.time()
    load.join()
    print(f"     SIGKILL of {victim.name}: {load.ok} requests served, "
          f"{load.client_retries} retried by the clients, {load.lost} lost; "
          f"phase ended {time.time() - killed_at:.1f} s after the kill", flush=True)
    ec.check(load.lost == 0, f"requests lost after the SIGKILL: {load.errors[:5]}")
    done = [s for s in load.chat_servers if len(s) == TURNS]
    ec.check(len(done) == len(load.chat_servers) and len(done) >= len(load.threads),
             f"unfinished chats: {len(load.chat_servers) - len(done)}")
    cl.restart(victim)


def route(port, key, rid=None, max_tokens=1):
    """(status, the instance that answered) of a completion with X-Session-Id key."""
    h = {"X-Session-Id": key, **({"X-Request-Id": rid} if rid else {})}
    st, h, _ = call(port, "POST", "/v1/completions", {"prompt": "Once upon a time",
                                                      "max_tokens": max_tokens}, h, timeout=120)
    return st, h.get("x-cellm-server")


def test_drain_sigterm(cl):
    victim = cl.insts[0]
    keys = [k for k in (f"s{i}" for i in range(48)) if route(cl.slow_port, k)[1] == victim.name]
    ec.check(len(keys) >= 4, f"keys on {victim.name}: {keys}")
    load = Load(cl.port, "drain", PHASE_S).start()
    time.sleep(PHASE_S / 3)
    # A long completion on the instance keeps it draining while the keys'
    # requests come (the load sends chats, so its completions are this one).
    long, n = {}, 'cellm_requests_total{endpoint="completions"}'
    base = metrics(victim.port)[n]
    t = threading.Thread(target=lambda: long.setdefault("r", route(cl.slow_port, keys[0],
                                                                   max_tokens=48)))
    t.start()
    deadline = time.time() + 60
    while metrics(victim.port)[n] == base and time.time() < deadline:
        time.sleep(0.02)
    victim.proc.send_signal(signal.SIGTERM)
    while call(victim.port, "GET", "/health")[0] == 200 and time.time() < deadline:
        time.sleep(0.01)
    # Keys of the draining instance: 503 there, retried on another.
    for k in keys[1:4]:
        st, srv = route(cl.slow_port, k, rid=f"moved-{k}")
        ec.check(st == 200 and srv not in (None, victim.name),
                 f"a request for the draining instance: {st} from {srv}")
    rc = victim.proc.wait(timeout=90)
    t.join(timeout=300)
    with open(victim.log) as f:
        log = f.read()
    # It finishes there, unless the machine is so slow that the drain's
    # time ran out: then HAProxy retried it elsewhere (empty-response).
    cut = "drain ended with" in log
    ec.check(long.get("r", (0,))[0] == 200 and (cut or long["r"][1] == victim.name),
             f"the request running there: {long}")
    moved = [k for k in keys[1:4] if f"request moved-{k} POST /v1/completions 503" in log]
    ec.check(keys[1] in moved,
             f"the first request after the SIGTERM was not refused there: {moved}")
    ec.check(rc == 0, f"{victim.name} exited with {rc} after SIGTERM")
    cl.restart(victim)
    load.join()
    served = {s for chat in load.chat_servers for s in chat}
    print(f"     SIGTERM and restart of {victim.name}: {load.ok} requests served by "
          f"{sorted(served)}, {load.client_retries} failed", flush=True)
    ec.check(load.client_retries == 0 and load.lost == 0,
             f"requests failed during the drain: {load.errors[:5]}")


def main():
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="cellm-deploy-")
    try:
        if ec.selected("test_asan_instance"):
            t = time.time()
            test_asan_instance(tmp)
            print(f"ok   test_asan_instance ({time.time() - t:.1f} s)", flush=True)
        cases = [(n, f) for n, f in (("affinity_vs_round_robin", test_affinity_vs_round_robin),
                                     ("failover_sigkill", test_failover_sigkill),
                                     ("drain_sigterm", test_drain_sigterm)) if ec.selected(n)]
        if cases:
            with Cluster(tmp) as cl:
                for name, fn in cases:
                    t = time.time()
                    fn(cl)
                    print(f"ok   {name} ({time.time() - t:.1f} s)", flush=True)
        print(f"{WHO}: {ec.checks} checks passed in {time.time() - t0:.1f} s")
    except BaseException:
        print(f"{WHO}: logs in {tmp}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
