"""Suite-wide: no test key (tests/secrets.py) may appear in what the code under test
writes: a test's captured logs and output, or any *.log file the tests leave behind
(the e2e servers' logs, for one)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.secrets import MARK


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when != "teardown":  # its sections hold every phase's capture
        return
    leaks = [title for title, text in report.sections if MARK in text]
    if leaks:
        report.outcome = "failed"
        report.longrepr = f"a test key appeared in: {', '.join(leaks)}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        base: Path = factory.getbasetemp()
    except (OSError, ValueError):
        return
    leaked = [p for p in base.rglob("*.log") if p.is_file() and MARK.encode() in p.read_bytes()]
    if leaked:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nA test key appeared in these log files: {', '.join(map(str, leaked))}")
