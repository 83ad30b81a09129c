"""Run llama.cpp's server test suite (tools/server/tests) against llama-server or Corral.

    python -m tests.peer.run_upstream --server corral --out corral.json [FILES...]
    python -m tests.peer.run_upstream --server llama-server --llama-server PATH --out llama.json
    python -m tests.peer.run_upstream --compare llama.json corral.json

The suite is the one in the llama-cpp-python sdist that pyproject pins (the llama.cpp that
Corral's worker runs), fetched from PyPI with `pip download` into the tests' cache
(tests/harness.py, `registry_cache`), where its virtual environment is built too; each run's
files go to .peer/. It runs unchanged: only the binary it starts is replaced, through its own
LLAMA_SERVER_BIN_PATH, by a launcher (tests/peer/launch_*.py) that serves every model the
test names by Hugging Face repository from one local GGUF (--model, default the demo
model), so that both servers answer with the same model. The suite's Python packages go
into a virtual environment of their own (its requirements.txt pins them).

Each run writes {test id: "passed" | "failed" | "skipped" | "error"} as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tarfile
import venv
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

from tests.harness import registry_cache

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".peer"  # each run's configs, logs and results
DEMO_MODEL = REPO / "models" / "gemma-3-270m-Q4_K_M.gguf"

# The files the issue counts (basic, tokenize, embedding, security, completion, template,
# tool call, chat completion, rerank, router mode).
COUNTED = (
    "test_basic.py", "test_tokenize.py", "test_embedding.py", "test_security.py",
    "test_completion.py", "test_template.py", "test_tool_call.py", "test_chat_completion.py",
    "test_rerank.py", "test_router.py",
)


def llama_cpp_python_version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if '"llama-cpp-python==' in line:
            return line.split("==")[1].split('"')[0]
    raise SystemExit("pyproject.toml pins no llama-cpp-python version")


def suite_cache() -> Path:
    """The pinned sdist's suite and its virtual environment, shared by checkouts."""
    return registry_cache(f"llama-cpp-python-{llama_cpp_python_version()}")


@contextlib.contextmanager
def cache_locked() -> Iterator[None]:
    """The suite's cache to this process alone while it fetches or installs: parallel
    test workers (pytest-xdist), and other checkouts, run the selection at once."""
    with open(suite_cache() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def suite_dir() -> Path:
    """tools/server/tests of the pinned llama-cpp-python's sdist, fetched once."""
    with cache_locked():
        return _suite_dir()


def _suite_dir() -> Path:
    version = llama_cpp_python_version()
    cache = suite_cache()
    tests = cache / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp" / "tools" / "server" / "tests"
    if (tests / "utils.py").is_file():
        return tests
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={version}", "-d", str(cache)],
        check=True,
    )
    with tarfile.open(cache / f"llama_cpp_python-{version}.tar.gz") as tar:
        # The tests read chat templates from llama.cpp's models/templates.
        members = [m for m in tar.getmembers() if "/tools/server/tests/" in m.name or "/models/templates/" in m.name]
        tar.extractall(cache, members=members, filter="data")
    return tests


def suite_python(tests: Path) -> Path:
    """A virtual environment with the suite's requirements."""
    with cache_locked():
        return _suite_python(tests)


def _suite_python(tests: Path) -> Path:
    env = suite_cache() / f"venv-py{sys.version_info.major}.{sys.version_info.minor}"
    python = env / "bin" / "python"
    stamp = env / "installed"
    # Built on this interpreter, with these requirements: anything else builds it again.
    wanted = f"{getattr(sys, '_base_executable', sys.executable)}\n{(tests / 'requirements.txt').read_text()}"
    if not stamp.exists() or stamp.read_text() != wanted:
        venv.create(env, with_pip=True, clear=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(tests / "requirements.txt")], check=True)
        stamp.write_text(wanted)
    return python


def launcher(kind: str, work: Path) -> Path:
    """An executable that the suite starts as llama-server."""
    module = "tests.peer.launch_corral" if kind == "corral" else "tests.peer.launch_llama_server"
    script = work / f"llama-server-{kind}"
    script.write_text(
        f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m {module} "$@"\n'
    )
    script.chmod(0o755)
    return script


def outcomes(junit: Path) -> dict[str, str]:
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name')}"
        tags = {child.tag for child in case}
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        result[name] = outcome
    return result


# The adapter test_lora.py downloads from Hugging Face (made for stories15M_MOE): where the
# suite's download_file looks before it downloads.
LORA_FILE = Path("tmp") / "moe_shakespeare15M.gguf"


def lora_stand_in(tests: Path, model: Path) -> None:
    """A random-weight adapter for `model` (bench/lora_adapter.py) where test_lora.py finds
    its own: the suite's download_file takes a file already there. Its scale-0 and scale-1
    answers are the stand-in model's, so the test's regexes of Shakespeare's words fail on
    content; what runs is the route and the scale handling, against both servers alike."""
    from bench import lora_adapter

    path = tests / LORA_FILE
    path.parent.mkdir(exist_ok=True)
    lora_adapter.write(model, path, seed=1)


def run_tests(
    server: str,
    targets: list[str],
    port: int | None = None,
    model: str | Path = DEMO_MODEL,
    llama_server: str | None = None,
    slow: bool = False,
    k: str | None = None,
    workers: int = 1,
    cores: set[int] | None = None,
) -> tuple[dict[str, str], Path]:
    """Run `targets` (files or node ids under the suite's unit/) against `server` (on
    `cores` when given, else this process's); each test's outcome, and the pytest log."""
    tests = suite_dir()
    python = suite_python(tests)
    work = WORK / f"work-{server}-{port or 8080}"
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN_PATH": str(launcher(server, work)),
        "PEER_MODEL": str(Path(model).resolve()),
        "PEER_WORK": str(work),
        "PEER_SUITE": str(tests),  # its utils.py names the presets (launch_corral.is_download)
    }
    if port:
        env["PORT"] = str(port)  # the suite's own knob (utils.py); xdist workers add 10 each
    if server == "llama-server":
        assert llama_server is not None
        env["PEER_LLAMA_SERVER"] = str(Path(llama_server).resolve())
    if any(t.startswith("test_lora") for t in targets):
        lora_stand_in(tests, Path(model))
    junit = work / "junit.xml"
    junit.unlink(missing_ok=True)
    command = [str(python), "-m", "pytest", *[f"unit/{t}" for t in targets], "-p", "no:cacheprovider",
               f"--junitxml={junit}", "-q"]
    if not slow:  # as the suite's own tests.sh runs it unless SLOW_TESTS=1
        command += ["-m", "not slow"]
    if workers > 1:
        command += ["-n", str(workers)]
    if k:
        command += ["-k", k]
    log = work / "pytest.log"
    with open(log, "w") as out:
        subprocess.run(command, cwd=tests, env=env, stdout=out, stderr=subprocess.STDOUT,
                       preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores))
    return (outcomes(junit) if junit.exists() else {}), log


def run(args: argparse.Namespace) -> int:
    result, log = run_tests(
        args.server, list(args.files or COUNTED), args.port, args.model, args.llama_server, args.slow, args.k,
        args.workers,
    )
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    counts = {o: sum(1 for v in result.values() if v == o) for o in ("passed", "failed", "error", "skipped")}
    print(f"{args.server}: {counts} (log: {log})")
    return 0


def compare(baseline_file: str, candidate_file: str) -> int:
    """How many of the tests that pass on the baseline pass on the candidate, file by file,
    and the ones that do not."""
    baseline = json.loads(Path(baseline_file).read_text())
    candidate = json.loads(Path(candidate_file).read_text())
    passing = sorted(t for t, o in baseline.items() if o == "passed")
    per_file: dict[str, list[int]] = {}
    missing: list[str] = []
    for test in passing:
        counts = per_file.setdefault(test.split("::")[0], [0, 0])
        counts[0] += 1
        if candidate.get(test) == "passed":
            counts[1] += 1
        else:
            missing.append(f"{test}: {candidate.get(test, 'not run')}")
    for name, (base, cand) in sorted(per_file.items()):
        print(f"{name:32} {cand:4} / {base:4}")
    total_base = len(passing)
    total_cand = total_base - len(missing)
    share = total_cand / total_base if total_base else 0.0
    extra = sorted(t for t, o in candidate.items() if o == "passed" and baseline.get(t) != "passed")
    print(f"{'all':32} {total_cand:4} / {total_base:4} = {share:.1%}")
    if extra:
        print(f"passing on the candidate only: {len(extra)}")
    for line in missing:
        print("  not passing:", line)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", choices=("corral", "llama-server"), default="corral")
    p.add_argument("--llama-server", help="the llama-server binary (for --server llama-server)")
    p.add_argument("--model", default=str(DEMO_MODEL), help="the GGUF both servers serve")
    p.add_argument("--out", default="peer-results.json")
    p.add_argument("--workers", type=int, default=1, help="pytest-xdist workers")
    p.add_argument("-k", help="pytest's -k expression")
    p.add_argument("--slow", action="store_true", help="include the tests marked slow (real-model downloads upstream)")
    p.add_argument("--port", type=int, help="the first server's port (default: the suite's, 8080)")
    p.add_argument("--compare", nargs=2, metavar=("BASELINE", "CANDIDATE"))
    p.add_argument("files", nargs="*", help=f"test files (default: {' '.join(COUNTED)})")
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.server == "llama-server" and not args.llama_server:
        p.error("--server llama-server needs --llama-server PATH")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
