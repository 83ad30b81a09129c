"""What the worker says before a load whose mlock the system will refuse (issue 43: an mlock
that fails is a warning, as in llama.cpp, which logs it buffer by buffer and loads the model
unpinned; the worker says why once, with the limit and the fix, before it starts)."""

from __future__ import annotations

import resource

import pytest

from worker import load_params
from worker.protocol.load_options import LoadOptions


def test_a_memlock_limit_below_the_model_is_said_before_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_params, "_may_lock_any", lambda: False)
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (8 << 20, 8 << 20))
    why = load_params.mlock_warning(LoadOptions(mlock=True), 300 << 20)
    assert why is not None and "RLIMIT_MEMLOCK" in why and "8 MiB" in why and "300 MiB" in why
    assert "LimitMEMLOCK=" in why
    assert load_params.mlock_warning(LoadOptions(mlock=False), 300 << 20) is None
    assert load_params.mlock_warning(LoadOptions(mlock=True), 4 << 20) is None  # it fits


def test_no_warning_where_the_process_may_lock_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (8 << 20, 8 << 20))
    monkeypatch.setattr(load_params, "_may_lock_any", lambda: True)  # CAP_IPC_LOCK
    assert load_params.mlock_warning(LoadOptions(mlock=True), 300 << 20) is None
    monkeypatch.setattr(load_params, "_may_lock_any", lambda: False)
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert load_params.mlock_warning(LoadOptions(mlock=True), 300 << 20) is None
