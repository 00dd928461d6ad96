"""cellm: on-device LLM inference from Python, over libcellm (ctypes).

    import cellm
    with cellm.Model("smollm2-135m.gguf") as model, cellm.Engine(model) as engine:
        print(engine.generate("The capital of France is", max_tokens=16))
        for piece in engine.chat([{"role": "user", "content": "Hi!"}], stream=True):
            print(piece, end="", flush=True)

A Model is a loaded GGUF file; an Engine serves any number of requests on
it at once (continuous batching on its own thread). engine.stream() and
engine.chat(..., stream=True) return a Stream: an iterator of text pieces
as the engine makes them, which any thread may cancel(). Failures raise
CellmError with the library's message. Objects free their native memory
on close() (or leaving a `with` block); closing twice is harmless, and
closing an engine or model first closes what was made from it.
"""

import ctypes
import json
import queue
import threading
import weakref

from . import _native as _n

__all__ = ["CellmError", "Model", "Engine", "Stream", "Session", "Result", "version",
           "parse_tool_calls"]


class CellmError(Exception):
    """A failure reported by libcellm. `status` is the cellm_status name
    ("io error", "invalid argument", ...), `message` the library's text."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        super().__init__(f"{message} ({status})" if message else status)


def _status_name(code):
    s = _n.lib().cellm_status_str(code)
    return s.decode("utf-8", "replace") if s else str(code)


def _check(code):
    if code != _n.STATUS_OK:
        msg = _n.lib().cellm_last_error() or b""
        raise CellmError(_status_name(code), msg.decode("utf-8", "replace"))


def version():
    """The library version, "MAJOR.MINOR.PATCH"."""
    return _n.lib().cellm_version().decode()


class Result:
    """How a generation ended: finish_reason ("stop", "length",
    "cancelled", "error"), token counts and timings (milliseconds)."""

    def __init__(self, r):
        self.finish_reason = _n.FINISH_REASONS.get(r.finish_reason, "error")
        self.n_prompt_tokens = r.n_prompt_tokens
        self.n_completion_tokens = r.n_completion_tokens
        self.n_cached_tokens = r.n_cached_tokens
        self.first_token_ms = r.first_token_ms
        self.total_ms = r.total_ms

    def __repr__(self):
        return (f"Result(finish_reason={self.finish_reason!r}, n_prompt_tokens="
                f"{self.n_prompt_tokens}, n_completion_tokens={self.n_completion_tokens})")


class _Owner:
    """Closes the objects made from it before itself. Its lock is held
    while its handle is used to make a child and while close() takes the
    handle away, so a child made on another thread during close() is either
    closed with the others or refused."""

    def __init__(self):
        self._h = None
        self._children = weakref.WeakSet()
        self._lock = threading.RLock()

    def _adopt(self, child):
        with self._lock:
            self._children.add(child)

    def close(self):
        """Closes what was made from this object, then frees it (closing
        twice is harmless)."""
        with self._lock:
            self._h = None
            children = list(self._children)
        for c in children:
            if isinstance(c, Stream):
                c.cancel()  # all at once: they end in one step
        for c in children:
            c.close()
        self._fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Model(_Owner):
    """A GGUF model loaded from `path` (weights mapped, not copied).
    `chat_template`: None for the model's own, "chatml", "gemma", "llama3",
    or a Jinja template of your own."""

    def __init__(self, path, chat_template=None):
        super().__init__()
        lib = _n.lib()
        p = lib.cellm_model_default_params()
        if chat_template is not None:
            p.chat_template = chat_template.encode()
        h = ctypes.c_void_p()
        _check(lib.cellm_model_load(str(path).encode(), ctypes.byref(p), ctypes.byref(h)))
        self._h = h.value
        self._fin = weakref.finalize(self, lib.cellm_model_free, self._h)

    def _handle(self):
        if self._h is None:
            raise CellmError("invalid argument", "the model is closed")
        return self._h

    @property
    def info(self):
        """A dict: name, arch, n_vocab, n_ctx_train, bos, eos."""
        i = _n.ModelInfo()
        _check(_n.lib().cellm_model_get_info(self._handle(), ctypes.byref(i)))
        return {"name": i.name.decode("utf-8", "replace"), "arch": i.arch.decode(),
                "n_vocab": i.n_vocab, "n_ctx_train": i.n_ctx_train, "bos": i.bos, "eos": i.eos}

    def tokenize(self, text):
        """Token ids of `text` (special tokens recognised, BOS where the
        model wants it)."""
        ids = ctypes.POINTER(ctypes.c_int32)()
        n = ctypes.c_int32()
        _check(_n.lib().cellm_tokenize(self._handle(), text.encode(), ctypes.byref(ids),
                                       ctypes.byref(n)))
        try:
            return [ids[i] for i in range(n.value)]
        finally:
            _n.libc_free(ids)



def parse_tool_calls(text, tools=None):
    """The tool calls in a model's reply (cellm_tool_calls_parse): a dict
    {"content": text outside the calls or None, "tool_calls": [{"name",
    "arguments" (a JSON string)}, ...]}. With `tools` (OpenAI tool dicts),
    calls of other functions do not count. A reply with no valid call has
    "tool_calls": [] and all its text as content."""
    lib = _n.lib()
    raw = text.encode()
    out = ctypes.c_void_p()
    _check(lib.cellm_tool_calls_parse(raw, len(raw),
                                      json.dumps(tools).encode() if tools else None,
                                      ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode("utf-8", "replace"))
    finally:
        _n.libc_free(out.value)


def _sampling(s, temperature, top_k, top_p, min_p, seed, repeat_penalty):
    if temperature is not None:
        s.temperature = temperature
    if top_k is not None:
        s.top_k = top_k
    if top_p is not None:
        s.top_p = top_p
    if min_p is not None:
        s.min_p = min_p
    if seed is not None:
        s.seed = seed
    if repeat_penalty is not None:
        s.repeat_penalty = repeat_penalty


class _Args:
    """What a request points to, kept alive until the library has copied it
    (cellm_submit copies everything before it returns)."""

    def __init__(self, p, max_tokens, stop, sampling):
        self.keep = []
        if max_tokens is not None:
            p.max_tokens = max_tokens
        _sampling(p.sampling, *sampling)
        if stop:
            if isinstance(stop, str):
                stop = [stop]
            if len(stop) > _n.MAX_STOP_STRINGS:
                raise CellmError("invalid argument",
                                 f"at most {_n.MAX_STOP_STRINGS} stop strings")
            arr = (ctypes.c_char_p * len(stop))(*[s.encode() for s in stop])
            self.keep.append(arr)
            p.stop = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
            p.n_stop = len(stop)

    def messages(self, p, messages, tools=None):
        if tools:
            self.keep.append(json.dumps(tools).encode())
            p.tools_json = self.keep[-1]
        if any("tool_calls" in m or m.get("role") == "tool" for m in messages):
            # Tool turns go as JSON (cellm_request_params.messages_json).
            self.keep.append(json.dumps(messages).encode())
            p.messages_json = self.keep[-1]
            return
        arr = (_n.ChatMessage * len(messages))()
        for i, m in enumerate(messages):
            arr[i].role = m["role"].encode()
            arr[i].content = m["content"].encode()
        self.keep.append(arr)
        p.messages = arr
        p.n_messages = len(messages)


# Native requests submitted and not yet freed (for the tests).
_live = [0]
_live_lock = threading.Lock()


def _live_requests():
    with _live_lock:
        return _live[0]


# Set while a thread runs one of the request callbacks.
_in_callback = threading.local()
_kept_alive = []


class _StreamState:
    """The part of a Stream the engine thread's callbacks touch. It holds no
    reference to the Stream, so a dropped Stream is still collected (its
    finalizer cancels and frees the request)."""

    _DONE = object()

    def __init__(self):
        self.q = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.req = None
        self.result = None
        # ctypes callbacks must stay alive while the request may call them.
        self.on_piece = _n.PIECE_FN(self._piece)
        self.on_done = _n.DONE_FN(self._done)

    def _piece(self, ptr, n, _user):
        _in_callback.active = True
        try:
            # Pieces are whole UTF-8 characters; errors="replace" only
            # guards against a library bug, never raising on the engine thread.
            self.q.put(ctypes.string_at(ptr, n).decode("utf-8", "replace"))
        finally:
            _in_callback.active = False

    def _done(self, res, _user):
        _in_callback.active = True
        try:
            self.result = Result(res.contents)
            self.q.put(self._DONE)
        finally:
            _in_callback.active = False

    def cancel(self):
        with self.lock:
            if self.req is not None:
                _n.lib().cellm_cancel(self.req)

    def free(self):
        """Cancels the request if it runs and frees it: after this, no
        callback of it runs again."""
        with self.lock:
            req, self.req = self.req, None
        if req is not None:
            if getattr(_in_callback, "active", False):
                # A garbage collection ran this finalizer inside a callback:
                # cellm_request_free does not wait there, so the callbacks
                # may still run later and must outlive this call.
                _kept_alive.append(self)
            lib = _n.lib()
            lib.cellm_cancel(req)
            lib.cellm_request_free(req)  # waits for the done callback
            with _live_lock:
                _live[0] -= 1


class Stream:
    """A running generation: iterate it for the text pieces as they come
    (each a str of whole characters). cancel() from any thread stops it;
    the iteration then ends. After the last piece, `result` says how it
    finished and `text` holds the whole text. A generation that fails
    raises CellmError from the iteration."""

    def __init__(self, owner, submit):
        self._state = st = _StreamState()
        self._pieces = []
        self._finished = False
        req = ctypes.c_void_p()
        _check(submit(st, ctypes.byref(req)))
        st.req = req.value
        with _live_lock:
            _live[0] += 1
        self._fin = weakref.finalize(self, st.free)
        owner._adopt(self)

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        item = self._state.q.get()
        if item is _StreamState._DONE:
            self._finish()
            raise StopIteration
        self._pieces.append(item)
        return item

    def _finish(self):
        st = self._state
        self._finished = True
        msg = None
        with st.lock:
            if st.req is not None and st.result.finish_reason == "error":
                msg = (_n.lib().cellm_request_error(st.req) or b"").decode("utf-8", "replace")
        self._fin()  # frees the request: it has finished
        if msg is not None:
            raise CellmError("error", msg or "the generation failed")

    def cancel(self):
        """Asks the generation to stop (thread-safe; harmless once it has
        finished). The pieces already made still come out of the iterator,
        then it ends with result.finish_reason "cancelled"."""
        self._state.cancel()

    @property
    def text(self):
        """The text so far (all of it once the iteration has ended)."""
        return "".join(self._pieces)

    @property
    def result(self):
        """The Result; waits for the generation to finish (consuming the
        pieces not yet read into `text`)."""
        for _ in self:
            pass
        return self._state.result

    def close(self):
        """Cancels the generation if it still runs and frees it."""
        self._finished = True
        self._fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Engine(_Owner):
    """Serves requests on `model`, batching all that run at once. Keyword
    arguments: n_threads (0: cores, at most 4), mem_budget (bytes, default
    256 MiB: KV cache and activations), max_ctx (positions per request),
    max_seqs (requests at once), kv_type ("f16", "q8_0", "q4_0", "q4_0h", "k5v4h", "q4_0hw",
    "k5v4hw", "q3_0hw", "k4v3hw" or "k4cv4hw"),
    prefix_cache (default True), process_budget (bytes: a cap on the whole
    process, the phone memory mode; refused unless max_seqs requests of
    max_ctx fit).

    The generation methods take max_tokens (default 256), temperature
    (default 0: greedy), top_k, top_p, min_p, seed, repeat_penalty and stop
    (a string or a list of up to 16)."""

    _KV_TYPES = {"f16": 0, "q8_0": 1, "q4_0": 2, "q4_0h": 3, "k5v4h": 4, "q4_0hw": 5, "k5v4hw": 6,
                 "q3_0hw": 7, "k4v3hw": 8, "k4cv4hw": 9}

    def __init__(self, model, n_threads=0, mem_budget=None, max_ctx=0, max_seqs=None,
                 kv_type="f16", prefix_cache=True, process_budget=None):
        super().__init__()
        lib = _n.lib()
        p = lib.cellm_engine_default_params()
        p.n_threads = n_threads
        p.max_ctx = max_ctx
        if mem_budget is not None:
            p.mem_budget_bytes = mem_budget
        if max_seqs is not None:
            p.max_seqs = max_seqs
        if kv_type not in self._KV_TYPES:
            raise CellmError("invalid argument",
                             "kv_type must be one of " + ", ".join(self._KV_TYPES))
        p.kv_type = self._KV_TYPES[kv_type]
        p.prefix_cache = 1 if prefix_cache else 0
        if process_budget is not None:
            p.process_budget_bytes = process_budget
        h = ctypes.c_void_p()
        with model._lock:
            _check(lib.cellm_engine_create(model._handle(), ctypes.byref(p), ctypes.byref(h)))
            self._h = h.value
            self.model = model  # the model outlives the engine
            self._fin = weakref.finalize(self, lib.cellm_engine_free, self._h)
            model._adopt(self)

    def _handle(self):
        if self._h is None:
            raise CellmError("invalid argument", "the engine is closed")
        return self._h

    @property
    def n_ctx(self):
        """Positions one request may use (prompt and completion)."""
        with self._lock:
            return _n.lib().cellm_engine_n_ctx(self._handle())

    def _submit(self, fill, max_tokens, stop, sampling):
        lib = _n.lib()

        def submit(st, out):
            p = lib.cellm_request_default_params()
            args = _Args(p, max_tokens, stop, sampling)
            fill(args, p)
            p.on_piece = st.on_piece
            p.on_done = st.on_done
            return lib.cellm_submit(self._handle(), ctypes.byref(p), out)

        with self._lock:
            return Stream(self, submit)

    def stream(self, prompt, max_tokens=None, stop=None, temperature=None, top_k=None,
               top_p=None, min_p=None, seed=None, repeat_penalty=None):
        """Continues `prompt` (plain text; special tokens recognised, BOS
        added where the model wants it): a Stream of pieces."""
        prompt_b = prompt.encode()

        def fill(_args, p):
            p.prompt = prompt_b

        return self._submit(fill, max_tokens, stop,
                            (temperature, top_k, top_p, min_p, seed, repeat_penalty))

    def generate(self, prompt, **kw):
        """The continuation of `prompt` as one str (see stream())."""
        s = self.stream(prompt, **kw)
        with s:
            return "".join(s)

    def chat(self, messages, stream=False, max_tokens=None, stop=None, temperature=None,
             top_k=None, top_p=None, min_p=None, seed=None, repeat_penalty=None, tools=None):
        """The assistant's reply to `messages` (a list of {"role", "content"}
        dicts, roles "system", "user", "assistant"; with tools also
        assistant messages with "tool_calls" and "tool" results, as OpenAI
        has them), laid out with the model's chat template: a str, or a
        Stream with stream=True. `tools`: OpenAI tool dicts the template
        shows the model; parse_tool_calls() finds the calls in the reply."""
        if not messages:
            raise CellmError("invalid argument", "chat needs at least one message")

        def fill(args, p):
            args.messages(p, messages, tools)

        s = self._submit(fill, max_tokens, stop,
                         (temperature, top_k, top_p, min_p, seed, repeat_penalty))
        if stream:
            return s
        with s:
            return "".join(s)

    def session(self, system=None, max_tokens=None, temperature=None, top_k=None, top_p=None,
                min_p=None, seed=None, repeat_penalty=None):
        """A chat Session that keeps the KV cache of its earlier turns."""
        return Session(self, system, max_tokens,
                       (temperature, top_k, top_p, min_p, seed, repeat_penalty))



class Session(_Owner):
    """A conversation on an engine (engine.session()): send() adds a user
    message and streams the reply, which joins the history when it ends.
    One turn at a time; one thread at a time uses a session."""

    def __init__(self, engine, system, max_tokens, sampling):
        super().__init__()
        lib = _n.lib()
        p = lib.cellm_session_default_params()
        if system is not None:
            p.system = system.encode()
        if max_tokens is not None:
            p.max_tokens = max_tokens
        _sampling(p.sampling, *sampling)
        h = ctypes.c_void_p()
        with engine._lock:
            _check(lib.cellm_session_create(engine._handle(), ctypes.byref(p), ctypes.byref(h)))
            self._h = h.value
            self.engine = engine
            self._fin = weakref.finalize(self, lib.cellm_session_free, self._h)
            engine._adopt(self)

    def _handle(self):
        if self._h is None:
            raise CellmError("invalid argument", "the session is closed")
        return self._h

    def send(self, content, stop=None):
        """Sends a user message; returns the reply as a Stream."""
        lib = _n.lib()
        content_b = content.encode()

        def submit(st, out):
            h = self._handle()
            self.engine._handle()
            p = lib.cellm_session_request_params(h)
            args = _Args(p, None, stop, (None,) * 6)
            p.on_piece = st.on_piece
            p.on_done = st.on_done
            rc = lib.cellm_session_send(h, content_b, ctypes.byref(p), out)
            del args
            return rc

        with self._lock, self.engine._lock:
            s = Stream(self, submit)
            # The turn's request belongs to the engine too, so closing the
            # engine frees it before the engine.
            self.engine._adopt(s)
            return s

    @property
    def messages(self):
        """The conversation so far: a list of {"role", "content"} dicts."""
        msgs = ctypes.POINTER(_n.ChatMessage)()
        n = ctypes.c_int32()
        _check(_n.lib().cellm_session_messages(self._handle(), ctypes.byref(msgs),
                                               ctypes.byref(n)))
        return [{"role": msgs[i].role.decode(), "content": msgs[i].content.decode()}
                for i in range(n.value)]

