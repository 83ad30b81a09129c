"""examples/corral.service: it passes `systemd-analyze verify` with nothing ignored on a
machine that followed docs/install.md, `systemd-analyze security` rates it OK (<= 4.0), and
its settings agree with Corral's own timings and with the docs.

systemd 252 exits 0 even when it ignores a line ("Failed to parse service type,
ignoring" for Type=notify-reload, "Unknown key name" for a misspelt one), so the verify test
also fails on any such message.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from supervisor.config import ServerConfig, SupervisorConfig
from tests.e2e.conftest import ROOT

UNIT = ROOT / "examples" / "corral.service"
INSTALL_DOC = ROOT / "docs" / "install.md"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
MAX_EXPOSURE = 4.0


def unit_settings(text: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> every value assigned, in order (a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"setting outside a section: {line}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service() -> dict[str, list[str]]:
    return unit_settings(UNIT.read_text())["Service"]


def one(key: str, section: str = "Service") -> str:
    values = unit_settings(UNIT.read_text())[section].get(key)
    assert values is not None and len(values) == 1, f"{section}.{key}: {values}"
    return values[0]


def documented_venv() -> str:
    """The venv docs/install.md has the reader create for a service."""
    found = re.findall(r"python3 -m venv (/\S+)", INSTALL_DOC.read_text())
    assert len(set(found)) == 1, f"docs/install.md names {found or 'no'} venv"
    return str(found[0])


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|min)?", value)
    assert m, f"not a plain duration: {value}"
    return float(m[1]) * (60 if m[2] == "min" else 1)


def test_unit_file_verifies_cleanly_where_the_docs_installed_corral(tmp_path: Path) -> None:
    venv = documented_venv()
    exec_start = one("ExecStart")
    assert exec_start.startswith(f"{venv}/bin/corral serve "), (venv, exec_start)
    # What docs/install.md creates: a venv with a corral executable in bin/. verify checks
    # that ExecStart's binary exists, so the documented venv is re-rooted under tmp_path and
    # its corral is this environment's.
    corral = Path(sys.executable).parent / "corral"
    assert corral.exists()
    fake_venv = tmp_path / venv.lstrip("/")
    (fake_venv / "bin").mkdir(parents=True)
    (fake_venv / "bin" / "corral").symlink_to(corral)
    unit = UNIT.read_text().replace(f"{venv}/", f"{fake_venv}/")
    assert unit.count(str(fake_venv)) >= 1
    path = tmp_path / "corral.service"
    path.write_text(unit)
    r = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for bad in ("Failed to parse", "Unknown key", "Unknown lvalue", "Unknown section", "ignoring"):
        assert bad not in out, out
    assert "Type=notify\n" in unit and "NotifyAccess=main" in unit


def test_unit_fails_verify_where_corral_is_not_installed(tmp_path: Path) -> None:
    # The check above can fail: pointed at a venv that does not exist, verify complains.
    path = tmp_path / "corral.service"
    path.write_text(UNIT.read_text().replace(documented_venv() + "/", f"{tmp_path}/nowhere/"))
    r = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "is not executable" in r.stdout + r.stderr, r


def exposure(path: Path) -> tuple[float, str]:
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d) (\w+)", r.stdout)
    assert m, r.stdout + r.stderr
    return float(m[1]), m[2]


def test_security_exposure_is_ok_and_the_docs_quote_it() -> None:
    score, verdict = exposure(UNIT)
    assert score <= MAX_EXPOSURE and verdict == "OK", (score, verdict)
    # The figure quoted in the unit's header and in docs/deploy.md (twice) is the measured one.
    figure = f"{score:.1f} {verdict}"
    assert f"rates this unit {figure}" in UNIT.read_text()
    assert f"rates the unit {figure}" in DEPLOY_DOC.read_text()
    assert f"`systemd-analyze security`: {figure}" in DEPLOY_DOC.read_text()


def test_security_check_sees_the_hardening(tmp_path: Path) -> None:
    # Without its hardening the same unit rates UNSAFE, so the score above is this unit's.
    bare = "\n".join(
        line for line in UNIT.read_text().splitlines()
        if line.split("=")[0] in {"[Unit]", "[Service]", "[Install]", "Description", "Type",
                                  "ExecStart", "ExecReload", "WantedBy"}
    )
    path = tmp_path / "corral.service"
    path.write_text(bare + "\n")
    score, verdict = exposure(path)
    assert score > 9 and verdict == "UNSAFE", (score, verdict)


def test_the_hardening_the_deployment_relies_on() -> None:
    svc = service()
    expected = {
        "Type": "notify",  # systemd 252: notify-reload would be ignored (OPS_NOTES)
        "NotifyAccess": "main",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "KillMode": "mixed",
        "Restart": "on-failure",
        "User": "corral",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "MemoryDenyWriteExecute": "yes",  # checked by tests/e2e/test_sandboxed_serve.py
        "CapabilityBoundingSet": "",
        "UMask": "0077",
    }
    assert {k: svc.get(k, [None])[-1] for k in expected} == expected
    # The worker socketpairs and the notify socket are AF_UNIX; HTTP is AF_INET/AF_INET6.
    assert set(one("RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    # The filter tests/e2e/syscall_sandbox.py runs the server under is this one.
    from tests.e2e import syscall_sandbox

    filters = svc["SystemCallFilter"]
    assert filters[0].split() == syscall_sandbox.ALLOW_SETS
    assert [f.lstrip("~") for f in filters[1:]] == syscall_sandbox.DENY_SETS
    # Nothing is writable but the cache folder (worker/vocab_pieces.py reads it from
    # $CACHE_DIRECTORY): Corral writes no other file, and its worker sockets have no path.
    assert "ReadWritePaths" not in svc and "StateDirectory" not in svc
    assert one("CacheDirectory") == "corral"
    assert "/etc/corral" in one("ReadOnlyPaths").split()
    assert "WatchdogSec" in svc


def test_stop_timeout_covers_the_drain_and_the_worker_stops() -> None:
    # corral/serve.py: drain for drain_timeout, then stop the workers within
    # 3 x stop_grace + 5 s; systemd's SIGKILL must not cut either short.
    drain = ServerConfig().drain_timeout
    grace = SupervisorConfig().stop_grace
    assert seconds(one("TimeoutStopSec")) > drain + 3 * grace + 5


def test_restarts_are_rate_limited() -> None:
    # OPS_NOTES: only if StartLimitIntervalSec > StartLimitBurst x RestartSec, and both
    # belong in [Unit] (in [Service] systemd 252 ignores them).
    interval = seconds(one("StartLimitIntervalSec", "Unit"))
    burst = int(one("StartLimitBurst", "Unit"))
    assert interval > burst * seconds(one("RestartSec"))
    assert "StartLimitIntervalSec" not in service() and "StartLimitBurst" not in service()


def test_every_path_the_unit_names_is_set_up_by_the_docs() -> None:
    docs = INSTALL_DOC.read_text() + DEPLOY_DOC.read_text()
    svc = service()
    paths = [
        one("ExecStart").split()[0],
        one("ExecStart").split("--config", 1)[1].split()[0],
        *(p.lstrip("-") for p in one("ReadOnlyPaths").split()),
    ]
    for path in paths:
        assert path in docs, f"{path} (in the unit) is not in docs/install.md or docs/deploy.md"
    assert "useradd --system" in docs and svc["User"] == ["corral"]
