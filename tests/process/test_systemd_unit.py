"""examples/corral.service passes `systemd-analyze verify` with nothing ignored.

systemd 252 exits 0 even when it ignores a line ("Failed to parse service type,
ignoring" for Type=notify-reload), so the test also fails on any such message.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import ROOT


def test_unit_file_verifies_cleanly(tmp_path: Path) -> None:
    unit = (ROOT / "examples" / "corral.service").read_text()
    corral = Path(sys.executable).parent / "corral"
    assert corral.exists()
    # verify checks that ExecStart's binary exists: point it at this environment's.
    unit = unit.replace("/opt/corral/.venv/bin/corral", str(corral))
    path = tmp_path / "corral.service"
    path.write_text(unit)
    r = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for bad in ("Failed to parse", "Unknown key", "Unknown section", "ignoring"):
        assert bad not in out, out
    assert "Type=notify\n" in unit and "NotifyAccess=main" in unit
