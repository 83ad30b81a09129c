from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.process.support import StartLog, alive


@pytest.fixture(autouse=True)
def start_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StartLog]:
    """A clean FAKE_* environment with a start log for this test.

    On teardown, every fake worker this test started must be gone (a worker the supervisor
    leaked is a failure); leftovers are killed so one bad test cannot poison the next.
    """
    for key in list(os.environ):
        if key.startswith("FAKE_"):
            monkeypatch.delenv(key)
    log = StartLog(tmp_path / "starts.log")
    monkeypatch.setenv("FAKE_START_LOG", str(log.path))
    yield log
    deadline = time.monotonic() + 3.0
    leaked = [pid for pid in log.pids() if alive(pid)]
    while leaked and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked = [pid for pid in leaked if alive(pid)]
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not leaked, f"fake workers still running after the test: {leaked}"
