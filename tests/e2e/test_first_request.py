"""Issue 41, item 4: the README's first example, run with the command the README gives
(the venv's python: the openai package is installed there, not in the system's), against
`make serve`'s config."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from tests.e2e.conftest import ROOT, Server

COMMAND = ".venv/bin/python examples/first_request.py"


def test_the_readme_gives_the_command_that_runs_its_first_example() -> None:
    lines = [line.split("#", 1)[0].strip() for line in (ROOT / "README.md").read_text().splitlines()]
    assert COMMAND in lines, f"README.md should give `{COMMAND}` on a line of its own"


def test_the_first_example_answers_against_the_stock_config(stock_server: Server) -> None:
    argv = shlex.split(COMMAND)
    venv_python = ROOT / argv[0]
    # The checkout's venv is the one the README means; a suite run from another venv runs
    # the example with its own python, which has openai too (the test extra).
    python = str(venv_python) if venv_python.exists() else sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CORRAL_"))}
    done = subprocess.run(
        [python, *argv[1:]], cwd=ROOT, env={**env, "CORRAL_URL": stock_server.url},
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), "the example printed no answer"


def test_the_example_file_is_what_the_readme_shows() -> None:
    """The README shows the example's code; the file is that code (its docstring aside)."""
    code = (ROOT / "examples" / "first_request.py").read_text()
    body = code.split('"""', 2)[2].strip()
    assert body in (ROOT / "README.md").read_text(), "README.md shows examples/first_request.py as it is"
