"""Tests of the cellm Python package against the real default model.

Run (scripts/test.sh does, after `pip install --target DIR ./bindings/python`):
    PYTHONPATH=DIR CELLM_BIN=build/cellm python3 -m unittest discover -s bindings/python/tests -v

The model is $CELLM_TEST_SMOLLM2, else smollm2-135m.gguf in the store
(${CELLM_HOME:-$HOME/.cache/cellm}/models); expected texts come from the
`cellm` command ($CELLM_BIN, else build/cellm of the repository), run at
test time on the same prompts with greedy decoding. A missing model or
command fails the tests: they never skip.
"""

import ctypes
import gc
import os
import subprocess
import tempfile
import threading
import time
import unittest

import cellm
from cellm import _native

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))


# Greedy SmolLM2 counts on and on after this (until the context is full).
LONG_PROMPT = "Count from one to one thousand: one, two, three,"


def model_path():
    p = os.environ.get("CELLM_TEST_SMOLLM2")
    if not p:
        # The store's rule for every binding: $CELLM_HOME, else $HOME/.cache/cellm.
        home = os.environ.get("CELLM_HOME") or os.path.join(os.environ["HOME"], ".cache", "cellm")
        p = os.path.join(home, "models", "smollm2-135m.gguf")
    if not os.path.isfile(p):
        raise AssertionError(f"real model not found at {p}: run `cellm pull smollm2-135m`")
    return p


def cellm_bin():
    b = os.environ.get("CELLM_BIN") or os.path.join(REPO, "build", "cellm")
    if not os.access(b, os.X_OK):
        raise AssertionError(f"the cellm command is not at {b}: build it or set CELLM_BIN")
    return b


def cli_run(*args):
    """What `cellm run MODEL ARGS` prints: the answer and a newline."""
    out = subprocess.run([cellm_bin(), "run", model_path(), *args], check=True,
                         capture_output=True, timeout=300).stdout.decode("utf-8")
    assert out.endswith("\n"), out
    return out[:-1]


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = cellm.Model(model_path())
        cls.engine = cellm.Engine(cls.model, n_threads=2, max_ctx=1024)

    @classmethod
    def tearDownClass(cls):
        cls.engine.close()
        cls.model.close()
        # Every native request the tests made was freed.
        assert cellm._live_requests() == 0, cellm._live_requests()


class TestLibrary(unittest.TestCase):
    def test_installed_library(self):
        # Without CELLM_LIB the package uses the libcellm it was installed with.
        if not os.environ.get("CELLM_LIB"):
            lib = os.path.join(os.path.dirname(cellm.__file__), "libcellm.so")
            self.assertTrue(os.path.isfile(lib), lib)
        self.assertRegex(cellm.version(), r"^\d+\.\d+\.\d+$")

    def test_struct_layout(self):
        # Defaults the library fills in: a field missing or out of place in
        # the ctypes structs would read them from the wrong bytes.
        lib = _native.lib()
        r = lib.cellm_request_default_params()
        self.assertEqual(r.max_tokens, 256)
        self.assertEqual(r.sampling.repeat_last_n, 64)
        self.assertEqual(r.sampling.ngram_guard_repeats, 2)
        self.assertEqual(r.sampling.typical_p, 1.0)
        self.assertEqual(r.sampling.repeat_penalty, 1.0)
        self.assertEqual((r.n_stop, r.priority, r.n_messages), (0, 0, 0))
        self.assertIsNone(r.prompt)
        self.assertEqual((r.logprobs, r.top_logprobs, r.prompt_logprobs), (0, 0, 0))
        self.assertFalse(r.on_logprob)
        e = lib.cellm_engine_default_params()
        self.assertEqual(e.mem_budget_bytes, 256 << 20)
        self.assertEqual((e.max_batch_tokens, e.max_seqs, e.manual_steps), (256, 16, 0))
        self.assertEqual(e.qos.duty_cycle, 1.0)
        self.assertEqual((e.kv_type, e.prefix_cache, e.process_budget_bytes), (0, 1, 0))
        self.assertIsNone(e.draft_model)
        self.assertEqual((e.lookup_ngram, e.draft_max, e.draft_min, e.spec_step_rows), (0, 8, 1, 0))
        self.assertEqual(e.draft_p_min, 0.5)
        self.assertEqual((e.spec_accept, e.draft_always), (0, 0))
        s = lib.cellm_session_default_params()
        self.assertEqual(s.max_tokens, 256)
        self.assertEqual(s.sampling.repeat_last_n, 64)

    def test_struct_layout_matches_header(self):
        # Every ctypes struct against the C compiler's own sizeof and
        # offsetof from include/cellm.h: a field missing at a struct's end
        # passes the defaults check above, and then the library writes and
        # reads past the ctypes buffer (a grammar pointer from stray bytes).
        header = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "..", "..", "..", "include", "cellm.h")
        self.assertTrue(os.path.exists(header), header)
        structs = {"cellm_model_params": _native.ModelParams, "cellm_qos": _native.Qos,
                   "cellm_engine_params": _native.EngineParams,
                   "cellm_result": _native.Result, "cellm_chat_message": _native.ChatMessage,
                   "cellm_logit_bias": _native.LogitBias, "cellm_sampling": _native.Sampling,
                   "cellm_top_logprob": _native.TopLogprob,
                   "cellm_token_logprob": _native.TokenLogprob,
                   "cellm_request_params": _native.RequestParams,
                   "cellm_model_info": _native.ModelInfo,
                   "cellm_session_params": _native.SessionParams}
        lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "cellm.h"',
                 "int main(void) {"]
        expected = []
        for cname, cls in structs.items():
            lines.append(f'printf("%zu\\n", sizeof({cname}));')
            expected.append(f"{cname} size {ctypes.sizeof(cls)}")
            for name, _type in cls._fields_:
                lines.append(f'printf("%zu\\n", offsetof({cname}, {name}));')
                expected.append(f"{cname}.{name} at {getattr(cls, name).offset}")
        lines.append("return 0; }")
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            subprocess.run([os.environ.get("CC", "cc"), "-I", os.path.dirname(header), "-o", exe,
                            src], check=True)
            got = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
        actual = [e.rsplit(" ", 1)[0] + " " + g for e, g in zip(expected, got)]
        self.assertEqual(actual, expected)


class TestErrors(unittest.TestCase):
    def test_missing_model_path(self):
        path = "/nonexistent/dir/model.gguf"
        with self.assertRaises(cellm.CellmError) as cm:
            cellm.Model(path)
        self.assertEqual(cm.exception.status, "I/O error")
        self.assertIn(path, cm.exception.message)

    def test_not_a_model(self):
        with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
            f.write(b"this is not a GGUF file at all" * 10)
            f.flush()
            with self.assertRaises(cellm.CellmError) as cm:
                cellm.Model(f.name)
            self.assertEqual(cm.exception.status, "format error")
            self.assertTrue(cm.exception.message)

    def test_bad_template(self):
        with self.assertRaises(cellm.CellmError) as cm:
            cellm.Model(model_path(), chat_template="no-such-format")
        self.assertEqual(cm.exception.status, "invalid argument")


class TestGenerate(Base):
    PROMPT = "The three primary colors are"

    def test_generate_matches_cli(self):
        want = cli_run("--raw", "-p", self.PROMPT, "-n", "24")
        got = self.engine.generate(self.PROMPT, max_tokens=24)
        self.assertEqual(got, want)
        self.assertTrue(got.strip())

    def test_stream_pieces(self):
        s = self.engine.stream(self.PROMPT, max_tokens=24)
        pieces = list(s)
        self.assertGreater(len(pieces), 1)  # it streamed, not one block at the end
        self.assertTrue(all(isinstance(p, str) and p for p in pieces))
        self.assertEqual("".join(pieces), s.text)
        self.assertEqual(s.text, self.engine.generate(self.PROMPT, max_tokens=24))
        r = s.result
        self.assertIn(r.finish_reason, ("length", "stop"))
        if r.finish_reason == "length":
            self.assertEqual(r.n_completion_tokens, 24)
        self.assertEqual(r.n_prompt_tokens, len(self.model.tokenize(self.PROMPT)))

    def test_chat_matches_cli(self):
        q = "What is the capital of France?"
        want = cli_run("-p", q, "-n", "32", "--temp", "0")  # the engine's default: greedy
        got = self.engine.chat([{"role": "user", "content": q}], max_tokens=32)
        self.assertEqual(got, want)
        pieces = list(self.engine.chat([{"role": "user", "content": q}], max_tokens=32,
                                       stream=True))
        self.assertEqual("".join(pieces), want)

    def test_tools(self):
        # The tools reach the template (the generic system prompt, for
        # SmolLM2's): the prompt is longer, so the greedy reply differs.
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        plain = self.engine.chat(ask, max_tokens=8)
        with_tools = self.engine.chat(ask, max_tokens=8, tools=tools)
        self.assertNotEqual(plain, with_tools)
        # A round trip's tool turns render (messages_json).
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        turns = ask + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
        self.assertIsInstance(self.engine.chat(turns, max_tokens=8, tools=tools), str)
        with self.assertRaises(cellm.CellmError) as e:
            self.engine.chat([{"role": "tool", "content": 5}], tools=tools)
        self.assertIn("messages[0]", e.exception.message)
        got = cellm.parse_tool_calls(
            'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>', tools)
        self.assertEqual(got, {"content": "Sure.", "tool_calls": [
            {"name": "get_weather", "arguments": '{"city":"Paris"}'}]})
        self.assertEqual(cellm.parse_tool_calls("Hi {there}"),
                         {"content": "Hi {there}", "tool_calls": []})

    def test_stop_string(self):
        full = self.engine.generate(self.PROMPT, max_tokens=24)
        # A stop string from the middle of the text: the text ends before it.
        mid = full[len(full) // 2:len(full) // 2 + 3]
        self.assertTrue(mid)
        s = self.engine.stream(self.PROMPT, max_tokens=24, stop=[mid])
        text = "".join(s)
        self.assertEqual(text, full[:full.index(mid)])
        self.assertEqual(s.result.finish_reason, "stop")

    def test_cancel_from_another_thread(self):
        # Until the context is full (1024 positions): long unless cancelled.
        s = self.engine.stream(LONG_PROMPT, max_tokens=-1)
        first = threading.Event()
        canceller = threading.Thread(target=lambda: (first.wait(60), s.cancel()))
        canceller.start()
        n = 0
        for _ in s:
            n += 1
            first.set()
        canceller.join()
        r = s.result
        self.assertEqual(r.finish_reason, "cancelled")
        self.assertGreaterEqual(n, 1)
        self.assertLess(r.n_completion_tokens, 1000)
        s.cancel()  # after the end: harmless
        # The engine serves on after a cancel.
        self.assertTrue(self.engine.generate("Hello", max_tokens=4))

    def test_concurrent_streams_from_threads(self):
        prompts = ["Once upon a time", "The best way to learn is", "Water boils at"]
        alone = [self.engine.generate(p, max_tokens=16) for p in prompts]
        got = [None] * len(prompts)

        def work(i):
            got[i] = "".join(self.engine.stream(prompts[i], max_tokens=16))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(got, alone)  # batched together, the same text

    def test_bad_arguments(self):
        with self.assertRaises(cellm.CellmError) as cm:
            self.engine.generate("")
        self.assertEqual(cm.exception.status, "invalid argument")
        with self.assertRaises(cellm.CellmError):
            self.engine.generate("Hi", stop=["x"] * 17)
        with self.assertRaises(cellm.CellmError):
            self.engine.generate("Hi", temperature=float("nan"))
        with self.assertRaises(cellm.CellmError):
            self.engine.chat([])
        with self.assertRaises(cellm.CellmError):
            cellm.Engine(self.model, n_threads=-5)


class TestSession(Base):
    def test_two_turns(self):
        q = "What is the capital of France?"
        with self.engine.session(max_tokens=32) as chat:
            first = chat.send(q)
            text = "".join(first)
            self.assertEqual(text, self.engine.chat([{"role": "user", "content": q}],
                                                    max_tokens=32))
            second = chat.send("And of Italy?")
            self.assertTrue("".join(second))
            # The second turn reused the first turn's KV cache.
            self.assertGreater(second.result.n_cached_tokens, 0)
            msgs = chat.messages
            self.assertEqual([m["role"] for m in msgs], ["user", "assistant"] * 2)
            self.assertEqual(msgs[1]["content"], text)


class TestLifetimes(unittest.TestCase):
    def test_close_twice_and_out_of_order(self):
        model = cellm.Model(model_path())
        engine = cellm.Engine(model, n_threads=1, max_ctx=512)
        s = engine.stream(LONG_PROMPT, max_tokens=-1)
        next(s)
        chat = engine.session()
        # Closing the model first closes the engine, its stream and session.
        model.close()
        model.close()
        engine.close()
        s.close()
        chat.close()
        self.assertEqual(s.result.finish_reason, "cancelled")
        with self.assertRaises(cellm.CellmError):
            engine.generate("Hello")
        with self.assertRaises(cellm.CellmError):
            chat.send("Hello")
        with self.assertRaises(cellm.CellmError):
            model.tokenize("Hello")
        self.assertEqual(cellm._live_requests(), 0)

    def test_close_while_threads_submit(self):
        model = cellm.Model(model_path())
        engine = cellm.Engine(model, n_threads=1, max_ctx=256)
        started = threading.Event()
        ends = []
        streams = []

        def work():
            try:
                while True:
                    if len(streams) < 64:  # a bound on what the close cancels
                        streams.append(engine.stream("Hello", max_tokens=8))
                    else:
                        self.assertEqual(engine.n_ctx, 256)  # or refused once closed
                    started.set()
            except cellm.CellmError as e:
                ends.append(e.message)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        self.assertTrue(started.wait(60))
        time.sleep(0.2)
        engine.close()  # while the threads submit: each either made it or is refused
        for t in threads:
            t.join(60)
            self.assertFalse(t.is_alive())
        self.assertEqual(ends, ["the engine is closed"] * 2)
        self.assertGreater(len(streams), 0)
        for s in streams:
            self.assertIn(s.result.finish_reason, ("cancelled", "length", "stop"))
        model.close()
        self.assertEqual(cellm._live_requests(), 0)

    def test_dropped_stream_is_freed(self):
        with cellm.Model(model_path()) as model, cellm.Engine(model, n_threads=1) as engine:
            s = engine.stream(LONG_PROMPT, max_tokens=-1)
            next(s)
            st = s._state
            del s
            gc.collect()
            # The finalizer cancelled and freed the request.
            self.assertIsNone(st.req)
            self.assertEqual(st.result.finish_reason, "cancelled")
        self.assertEqual(cellm._live_requests(), 0)


if __name__ == "__main__":
    unittest.main()
