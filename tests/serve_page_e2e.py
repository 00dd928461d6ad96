#!/usr/bin/env python3
"""serve_page_e2e.py — the web chat page of `cellm serve` in headless Chromium.

Starts the real `cellm` binary ($CELLM_BIN) on a loopback port with SmolLM2,
opens http://127.0.0.1:PORT/ in headless Chromium (Debian's `chromium`),
types a message into the page and presses Enter as a user would, and watches
the answer grow as the server-sent events arrive. Passes when the page shows
a non-empty answer that came in several chunks, read at several lengths
along the way. Saves a screenshot (serve_page.png in the working directory,
or $CELLM_TEST_OUT) and prints its path.

Chromium is driven through the DevTools protocol over a pipe
(--remote-debugging-pipe: JSON messages ending in NUL on fds 3 and 4), so
no package beyond the browser is needed.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from e2e_common import selected, start_server, stop_server

QUESTION = "What is the capital of France?"


class Browser:
    """Headless Chromium with a DevTools session on one page."""

    def __init__(self, exe):
        self.tmp = tempfile.mkdtemp(prefix="cellm-chromium-")
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def fds():
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--window-size=900,700", f"--user-data-dir={self.tmp}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.buf, self.next_id, self.events, self.session = b"", 0, [], None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]

    def _read(self, deadline):
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("no message from Chromium")
            chunk = os.read(self.from_child, 65536)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, timeout=30, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, name, timeout=30):
        deadline = time.time() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == name:
                    return self.events.pop(i)
            self.events.append(self._read(deadline))

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def test_page(base, exe):
    b = Browser(exe)
    try:
        b.call("Page.enable")
        b.call("Runtime.enable")
        b.call("Page.navigate", url=base + "/")
        b.wait_event("Page.loadEventFired")
        title = b.js("document.title")
        assert title == "cellm chat", f"title {title!r}"
        # The page names the model once /v1/models has answered.
        deadline = time.time() + 20
        while b.js("document.getElementById('model').textContent") in ("…", ""):
            assert time.time() < deadline, "the page did not show the model"
            time.sleep(0.1)
        assert b.js("document.getElementById('model').textContent") == "smollm2"
        # Type the question and press Enter, as a user would.
        b.js("document.getElementById('input').focus()")
        b.call("Input.insertText", text=QUESTION)
        for kind in ("keyDown", "keyUp"):
            b.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                   windowsVirtualKeyCode=13, text="\r" if kind == "keyDown" else "")
        lengths, deadline = set(), time.time() + 300
        state_js = ("JSON.stringify({state: document.body.dataset.state || '', "
                    "chunks: Number(document.body.dataset.chunks || 0), "
                    "answer: (document.querySelector('.msg.assistant') || {}).textContent || '', "
                    "user: (document.querySelector('.msg.user') || {}).textContent || '', "
                    "error: (document.querySelector('.msg.error') || {}).textContent || ''})")
        while True:
            s = json.loads(b.js(state_js))
            lengths.add(len(s["answer"]))
            if s["state"] in ("done", "error"):
                break
            assert time.time() < deadline, f"no answer after 300 s: {s}"
            time.sleep(0.02)
        assert s["state"] == "done", f"the page shows an error: {s['error']}"
        assert s["user"] == QUESTION, f"user message {s['user']!r}"
        assert s["answer"].strip(), "empty answer"
        assert s["chunks"] > 1, f"the answer came in {s['chunks']} chunk(s), not streamed"
        seen = sorted(l for l in lengths if 0 < l < len(s["answer"]))
        stats = b.js("(document.querySelector('.stats') || {}).textContent || ''")
        shot = b.call("Page.captureScreenshot", format="png")["data"]
        out = os.path.join(os.environ.get("CELLM_TEST_OUT", os.getcwd()), "serve_page.png")
        with open(out, "wb") as f:
            f.write(base64.b64decode(shot))
        print(f"answer ({s['chunks']} chunks; partial lengths seen while streaming: "
              f"{seen[:8]}{'...' if len(seen) > 8 else ''}): {s['answer']!r}")
        print(f"page stats: {stats}")
        print(f"screenshot: {out}")
    finally:
        b.close()


def main():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        sys.exit("serve_page_e2e: chromium is missing: apt-get install chromium "
                 "(scripts/setup.sh --test installs it)")
    proc, base = start_server("serve_page_e2e", ["--alias", "smollm2", "-t", "2"])
    try:
        # CELLM_TEST_FILTER: as for the other tests (TSan runs test_tsan_* only).
        if selected("test_page"):
            test_page(base, exe)
            print("serve_page_e2e: the page loaded, sent a message and streamed the answer")
    finally:
        stop_server(proc, "serve_page_e2e")


if __name__ == "__main__":
    main()
