"""ctypes declarations of include/cellm.h and the loading of libcellm.

The structs below mirror the C header field by field (ctypes lays them out
with the C compiler's alignment rules); tests/test_cellm.py checks the
defaults the library fills in, which would come out wrong if a field were
missing or misplaced. Only the part of the API the Python package uses is
declared.
"""

import ctypes
import os
import sys

# ----------------------------------------------------------------- structs


class ModelParams(ctypes.Structure):
    _fields_ = [("chat_template", ctypes.c_char_p)]


class Qos(ctypes.Structure):
    _fields_ = [
        ("n_threads", ctypes.c_int),
        ("min_step_us", ctypes.c_int32),
        ("duty_cycle", ctypes.c_float),
    ]


class EngineParams(ctypes.Structure):
    _fields_ = [
        ("n_threads", ctypes.c_int),
        ("mem_budget_bytes", ctypes.c_size_t),
        ("max_batch_tokens", ctypes.c_int32),
        ("max_seqs", ctypes.c_int32),
        ("max_ctx", ctypes.c_int32),
        ("kv_type", ctypes.c_int),
        ("prefix_cache", ctypes.c_int),
        ("qos", Qos),
        ("manual_steps", ctypes.c_int),
        ("process_budget_bytes", ctypes.c_size_t),
        # Speculative decoding (not used by the package yet; declared so the
        # struct has the C size and the library's defaults come through).
        ("draft_model", ctypes.c_void_p),
        ("lookup_ngram", ctypes.c_int32),
        ("draft_max", ctypes.c_int32),
        ("draft_min", ctypes.c_int32),
        ("draft_p_min", ctypes.c_float),
        ("spec_step_rows", ctypes.c_int32),
        ("spec_accept", ctypes.c_int32),
        ("draft_always", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("image_budget_bytes", ctypes.c_size_t),
        ("gpu_layers", ctypes.c_int32),
    ]


class Result(ctypes.Structure):
    _fields_ = [
        ("finish_reason", ctypes.c_int),
        ("status", ctypes.c_int),
        ("n_prompt_tokens", ctypes.c_int32),
        ("n_completion_tokens", ctypes.c_int32),
        ("n_preemptions", ctypes.c_int32),
        ("n_cached_tokens", ctypes.c_int32),
        ("queue_ms", ctypes.c_double),
        ("first_token_ms", ctypes.c_double),
        ("total_ms", ctypes.c_double),
        ("stop_token", ctypes.c_int32),
        ("stop_index", ctypes.c_int32),
    ]


class ChatMessage(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


class LogitBias(ctypes.Structure):
    _fields_ = [("token", ctypes.c_int32), ("bias", ctypes.c_float)]


class Sampling(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("typical_p", ctypes.c_float),
        ("repeat_penalty", ctypes.c_float),
        ("repeat_last_n", ctypes.c_int32),
        ("presence_penalty", ctypes.c_float),
        ("frequency_penalty", ctypes.c_float),
        ("logit_bias", ctypes.POINTER(LogitBias)),
        ("n_logit_bias", ctypes.c_int32),
        ("ngram_guard", ctypes.c_int32),
        ("ngram_guard_repeats", ctypes.c_int32),
    ]


# The piece is declared as a void pointer: a c_char_p would be read up to a
# NUL, and pieces are not NUL-terminated.
PIECE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
DONE_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(Result), ctypes.c_void_p)


class TopLogprob(ctypes.Structure):
    _fields_ = [
        ("token", ctypes.c_int32),
        ("logprob", ctypes.c_float),
    ]


class TokenLogprob(ctypes.Structure):
    _fields_ = [
        ("token", ctypes.c_int32),
        ("pos", ctypes.c_int32),
        ("is_prompt", ctypes.c_int),
        ("logprob", ctypes.c_float),
        ("n_top", ctypes.c_int32),
        ("top", ctypes.POINTER(TopLogprob)),
    ]


LOGPROB_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(TokenLogprob), ctypes.c_void_p)


class RequestParams(ctypes.Structure):
    _fields_ = [
        ("prompt", ctypes.c_char_p),
        ("messages", ctypes.POINTER(ChatMessage)),
        ("n_messages", ctypes.c_int32),
        ("tokens", ctypes.POINTER(ctypes.c_int32)),
        ("n_tokens", ctypes.c_int32),
        ("sampling", Sampling),
        ("max_tokens", ctypes.c_int32),
        ("stop_tokens", ctypes.POINTER(ctypes.c_int32)),
        ("n_stop_tokens", ctypes.c_int32),
        ("stop", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop", ctypes.c_int32),
        ("priority", ctypes.c_int32),
        ("on_piece", PIECE_FN),
        ("on_done", DONE_FN),
        ("user", ctypes.c_void_p),
        ("logprobs", ctypes.c_int),
        ("top_logprobs", ctypes.c_int32),
        ("prompt_logprobs", ctypes.c_int),
        ("on_logprob", LOGPROB_FN),
        ("grammar", ctypes.c_void_p),
        ("messages_json", ctypes.c_char_p),
        ("tools_json", ctypes.c_char_p),
        # Pictures (cellm_image_encode's embeddings); the package sends none.
        ("images", ctypes.c_void_p),
        ("n_images", ctypes.c_int32),
    ]


class SessionParams(ctypes.Structure):
    _fields_ = [
        ("system", ctypes.c_char_p),
        ("sampling", Sampling),
        ("max_tokens", ctypes.c_int32),
    ]


class ModelInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 128),
        ("arch", ctypes.c_char * 32),
        ("n_vocab", ctypes.c_int32),
        ("n_ctx_train", ctypes.c_int32),
        ("bos", ctypes.c_int32),
        ("eos", ctypes.c_int32),
    ]


# cellm_finish_reason, as the names Result.finish_reason uses.
FINISH_REASONS = {0: "none", 1: "stop", 2: "length", 3: "cancelled", 4: "error"}
STATUS_OK = 0
STATUS_INVALID_ARG = 1
MAX_STOP_STRINGS = 16

# ------------------------------------------------------------------ loading

_LIB_NAMES = {"darwin": "libcellm.dylib", "win32": "cellm.dll"}


def _lib_path():
    """Where libcellm is: $CELLM_LIB, else the copy installed in the package."""
    env = os.environ.get("CELLM_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, _LIB_NAMES.get(sys.platform, "libcellm.so"))


def _declare(lib):
    c_int, c_p, c_pp = ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "cellm_status_str": (ctypes.c_char_p, [c_int]),
        "cellm_version": (ctypes.c_char_p, []),
        "cellm_last_error": (ctypes.c_char_p, []),
        "cellm_model_default_params": (ModelParams, []),
        "cellm_model_load": (c_int, [ctypes.c_char_p, ctypes.POINTER(ModelParams), c_pp]),
        "cellm_model_free": (None, [c_p]),
        "cellm_model_get_info": (c_int, [c_p, ctypes.POINTER(ModelInfo)]),
        "cellm_tokenize": (
            c_int,
            [c_p, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)),
             ctypes.POINTER(ctypes.c_int32)],
        ),
        "cellm_engine_default_params": (EngineParams, []),
        "cellm_engine_create": (c_int, [c_p, ctypes.POINTER(EngineParams), c_pp]),
        "cellm_engine_free": (None, [c_p]),
        "cellm_engine_error": (ctypes.c_char_p, [c_p]),
        "cellm_engine_n_ctx": (ctypes.c_int32, [c_p]),
        "cellm_request_default_params": (RequestParams, []),
        "cellm_submit": (c_int, [c_p, ctypes.POINTER(RequestParams), c_pp]),
        "cellm_cancel": (c_int, [c_p]),
        "cellm_wait": (c_int, [c_p, ctypes.POINTER(Result)]),
        "cellm_request_error": (ctypes.c_char_p, [c_p]),
        "cellm_request_free": (None, [c_p]),
        "cellm_session_default_params": (SessionParams, []),
        "cellm_session_create": (c_int, [c_p, ctypes.POINTER(SessionParams), c_pp]),
        "cellm_session_request_params": (RequestParams, [c_p]),
        "cellm_session_send": (
            c_int, [c_p, ctypes.c_char_p, ctypes.POINTER(RequestParams), c_pp]),
        "cellm_session_messages": (
            c_int, [c_p, ctypes.POINTER(ctypes.POINTER(ChatMessage)),
                    ctypes.POINTER(ctypes.c_int32)]),
        "cellm_session_free": (None, [c_p]),
        "cellm_tool_calls_parse": (
            c_int, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, c_pp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


_lib = None
_libc = None


def lib():
    """The loaded libcellm (loaded on first use). Raises OSError with the
    places it looked when it cannot be loaded."""
    global _lib, _libc
    if _lib is None:
        path = _lib_path()
        try:
            # CDLL (not PyDLL): every call releases the GIL, so the engine
            # thread can run the Python callbacks while a call waits.
            handle = ctypes.CDLL(path)
        except OSError as e:
            raise OSError(
                f"cellm: cannot load the native library {path!r} ({e}); install the package "
                "with `pip install ./bindings/python` from the cellm repository, or set "
                "CELLM_LIB to a built libcellm.so") from e
        _declare(handle)
        _libc = ctypes.CDLL(None)
        _libc.free.argtypes = [ctypes.c_void_p]
        _libc.free.restype = None
        _lib = handle
    return _lib


def libc_free(ptr):
    """free() from the C library, for arrays the API hands over."""
    lib()
    _libc.free(ptr)
