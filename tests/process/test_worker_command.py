"""The worker command runs Corral's worker, whatever folder `corral serve` started in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from supervisor.launcher import default_worker_command


def test_a_worker_folder_in_the_current_directory_is_not_run(tmp_path: Path) -> None:
    planted = tmp_path / "worker"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text('raise SystemExit("the planted worker ran")\n')
    done = subprocess.run(
        [*default_worker_command(), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert "planted" not in done.stderr and done.returncode == 0, done.stderr
