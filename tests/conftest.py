"""Suite-wide: no test key (tests/secrets.py) may appear in what the code under test
writes: a test's captured logs and output, or any *.log file the tests leave behind
(the e2e servers' logs, for one).

And how `make test` shares the suite among test workers (pytest-xdist, `-n N --dist
loadscope --no-loadscope-reorder`): each test module (or test class) is one unit of work,
so that a module's servers (its module-scoped fixtures) start once. The longest modules
are handed out first, in the order below, and each worker keeps to one core of its own."""

from __future__ import annotations

import os
import shutil
import tempfile
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


# The longest modules of `make test` (--durations on a two-core machine, slowest first):
# started first, so that none of them is the last thing still running.
LONGEST_FIRST = (
    "tests/e2e/test_agent_clis.py",  # Claude Code's 19,600-token prompt: 85-200 s
    "tests/peer/test_upstream_selection.py",  # 4 parts, 45-120 s each
    "tests/e2e/test_tool_formats.py",
    "tests/e2e/test_kv_pressure.py",
    "tests/e2e/test_embeddings_line.py",
    "tests/e2e/test_kv_mixes.py",
    "tests/e2e/test_openapi_fuzz.py",
    "tests/e2e/test_prefix_reuse.py",
    "tests/e2e/test_fuzz.py",
    "tests/e2e/test_forced_tool_calls.py",
    "tests/e2e/test_upstream_front.py",
    "tests/process/test_cli_admin.py",
    "tests/e2e/test_slot_files_hostile.py",
    "tests/e2e/test_speculation.py",
    "tests/e2e/test_draft_model.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable
    name_each_item(items)


def name_each_item(items: list[pytest.Item]) -> None:
    """Give an item whose node id leaves out its parameters the id its name says.

    schemathesis' items (one an API operation, tests/e2e/test_openapi_fuzz.py) all carry
    the bare function's id under pytest 9.2, which keeps a node id apart from its name
    (`Node._id`). pytest-xdist hands out tests by id: the 29 operations became one, and
    the fuzz under `-n 2` sent the requests of a single operation (found as a 6 s run of
    2,000 requests)."""
    for item in items:
        head, _, last = item.nodeid.rpartition("::")
        if head and last != item.name and hasattr(item, "_id"):
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(f"{head}::{item.name}")
    ids = [item.nodeid for item in items]
    assert len(ids) == len(set(ids)), "tests that share a node id: pytest-xdist would run one of them"


# The cores the run was given, before a test worker kept to one (a test that starts a
# server as a user would, with every core, reads them: tests/peer).
ALL_CORES = "CORRAL_TESTS_ALL_CORES"


def pytest_configure(config: pytest.Config) -> None:
    """The servers the tests start keep their cache (worker/vocab_pieces.py) in a folder of
    the run's, not the user's ~/.cache: test models live in temporary folders, and each run
    would leave their files there. Set here, in the process that starts the test workers,
    so that they share it; removed at the end.

    A test worker of several keeps to one core, and so does every server it starts:
    Corral gives each model as many threads as it has cores (os.sched_getaffinity), and
    two servers decoding with two threads each on two cores lose a quarter of their speed
    to llama.cpp's spinning threads (298 against 404 tokens/s in all, prefill of the demo
    model), where two with one thread each make 533."""
    if "CORRAL_CACHE_DIR" not in os.environ:
        folder = tempfile.mkdtemp(prefix="corral-test-cache-")
        os.environ["CORRAL_CACHE_DIR"] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    cores = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and len(cores) > 1 and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ.setdefault(ALL_CORES, ",".join(map(str, cores)))
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


def all_cores() -> set[int]:
    given = os.environ.get(ALL_CORES)
    return {int(c) for c in given.split(",")} if given else os.sched_getaffinity(0)
