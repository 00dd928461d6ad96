"""e2e_common.py — what the end-to-end tests of `cellm serve` share.

Each tests/*_e2e.py that drives the server with the official `openai`
package calls `run(NAME, tests)`: it starts the real `cellm` binary
($CELLM_BIN) with the real SmolLM2 model on an ephemeral loopback port
(API key KEY, model id MODEL_ID, greedy by default), runs the tests whose
names match $CELLM_TEST_FILTER (a glob, as for the cmocka tests: the
sanitizer builds select test_asan_* / test_tsan_*), then stops the server
with SIGTERM and requires a clean exit (under ASan that includes no
leaks). Not a test itself: ctest picks up only tests/*_e2e.py.
"""
import fnmatch
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

try:
    import openai
except ImportError:
    openai = None  # run() says so; serve_page_e2e.py needs only the server


def require(who, module):
    """The module `module`, or the test ends with a message saying how to
    install it (scripts/setup.sh --test does)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        sys.exit(f"{who}: the `{module}` package is missing: pip install {module} "
                 "(scripts/setup.sh --test installs it)")


KEY = "e2e-key"
MODEL_ID = "smollm2"
HERE = os.path.dirname(os.path.abspath(__file__))
checks = 0


def check(cond, what):
    """Counts a check; raises AssertionError(what) when it fails."""
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


def model_path(who, name="smollm2-135m", env="CELLM_TEST_SMOLLM2"):
    """The real model `name` of the store ($env overrides)."""
    p = os.environ.get(env)
    if p:
        return p
    home = os.environ.get("CELLM_HOME") or os.path.join(os.environ["HOME"], ".cache", "cellm")
    p = os.path.join(home, "models", name + ".gguf")
    if not os.path.exists(p):
        sys.exit(f"{who}: real model missing at {p}: run `cellm pull {name}`")
    return p


SERVER_ARGS = ["--api-key", KEY, "--alias", MODEL_ID, "-c", "1024", "-t", "2", "--temp", "0"]


def cellm_bin(who):
    binary = os.environ.get("CELLM_BIN")
    if not binary:
        sys.exit(f"{who}: CELLM_BIN is not set (ctest sets it)")
    return binary


def start_server(who, args=SERVER_ARGS, model=None):
    """Starts `cellm serve MODEL --port 0 ARGS` (MODEL: SmolLM2 unless
    given); returns (process, base URL)."""
    cmd = [cellm_bin(who), "serve", model or model_path(who), "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        sys.exit(f"{who}: the server did not start ({line!r})")
    return proc, line.split()[-1]


def request(base, path, body=None, raw=None):
    """A request with the API key, POST of body as JSON or of the bytes raw
    when either is given, else GET: (status, parsed JSON or text)."""
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data,
                                 headers={"Authorization": "Bearer " + KEY,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def post(base, path, body):
    """POSTs body as JSON; the parsed reply (raises unless 2xx)."""
    status, reply = request(base, path, body)
    if status // 100 != 2:
        raise AssertionError(f"POST {path}: {status} {reply}")
    return reply


def stop_server(proc, who):
    """SIGTERM; exits the test unless the server ends cleanly."""
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "killed after 60 s"
    if rc != 0:
        sys.exit(f"{who}: the server exited with {rc} on SIGTERM")


def selected(name):
    """Whether $CELLM_TEST_FILTER (a glob) selects the test `name`."""
    only = os.environ.get("CELLM_TEST_FILTER")
    return not only or fnmatch.fnmatch(name, only)


def run(who, tests, after=None):
    """Starts the server, runs tests [(name, fn(client, base))], then
    after(client, base) when given, and stops the server."""
    if openai is None:
        sys.exit(f"{who}: the `openai` package is missing: pip install openai "
                 "(scripts/setup.sh --test installs it)")
    proc, base = start_server(who)
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)
        t0 = time.time()
        for name, fn in tests:
            if not selected(name):
                continue
            t = time.time()
            fn(client, base)
            print(f"ok   {name} ({time.time() - t:.1f} s)", flush=True)
        if after:
            after(client, base)
        print(f"{who}: {checks} checks passed in {time.time() - t0:.1f} s "
              f"(openai {openai.__version__})")
    finally:
        stop_server(proc, who)
