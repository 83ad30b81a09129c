"""llama.cpp's log, routed into Python's: its warnings and errors always, and everything it
says while a model loads into a `LoadLog` (worker/load_log.py), which reads the KV cache's
size and the overridden tensors back out of it."""

from __future__ import annotations

import contextlib
import ctypes
import logging
from typing import Iterator

import llama_cpp

from worker.load_log import LoadLog

_llama_log = logging.getLogger("llama.cpp")
_GGML_LOG_WARN = 3  # ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont
_collecting: LoadLog | None = None


def on_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    msg = text.decode("utf-8", errors="replace").rstrip()
    if _collecting is not None and msg:
        _collecting.feed(level, msg)
    if level in (_GGML_LOG_WARN, _GGML_LOG_WARN + 1) and msg:
        _llama_log.log(logging.WARNING if level == _GGML_LOG_WARN else logging.ERROR, msg)


# Module-level so the ctypes thunk outlives every call into llama.cpp; a collected callback
# is a segfault on the next log line.
LOG_CALLBACK = llama_cpp.llama_log_callback(on_llama_log)


def quiet_llama_logs() -> None:
    """Forward only llama.cpp's warnings and errors; its info output is hundreds of lines."""
    llama_cpp.llama_log_set(LOG_CALLBACK, None)


@contextlib.contextmanager
def collecting() -> Iterator[LoadLog]:
    """Everything llama.cpp logs meanwhile, debug lines included, read into a LoadLog. A
    load runs on one thread at a time (worker/link.py), so one collector is enough."""
    global _collecting
    seen = LoadLog()
    _collecting = seen
    try:
        yield seen
    finally:
        _collecting = None
