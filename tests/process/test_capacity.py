"""Capacity with real (fake) worker processes: once a worker is loaded, its measured RSS
replaces the estimate from its file, and eviction decisions follow the real number."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from supervisor.lifecycle import State
from tests.process.support import StartLog, generate, make_supervisor, running

MiB = 1024 * 1024


async def test_measured_rss_replaces_the_estimate_and_drives_eviction(
    tmp_path: Path, start_log: StartLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "big" is an empty file (estimated at 0 bytes) whose worker holds 300 MiB; "small"
    # is a 150 MiB file. Judged by estimates both fit in 400 MiB; by RSS they do not.
    with open(tmp_path / "small.gguf", "wb") as f:
        f.truncate(150 * MiB)
    monkeypatch.setenv("FAKE_ALLOC_MB__big", "300")
    sup = make_supervisor(
        tmp_path, {"big": {}, "small": {"path": "small.gguf"}}, memory_budget="400MiB"
    )
    with trio.fail_after(20):
        async with running(sup):
            big, small = sup.resolve("big"), sup.resolve("small")
            assert big.cost() == 0
            async with big.lease() as conn:
                await generate(conn)
            assert big.rss is not None and big.cost() == big.rss > 300 * MiB
            async with small.lease() as conn:
                await generate(conn)
            assert small.state is State.READY
            assert big.state is State.STOPPED
            assert start_log.names() == ["big", "small"]
