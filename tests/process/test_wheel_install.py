"""The built wheel installs into a fresh venv and `corral serve` runs from it, as
docs/install.md tells an operator to do.

The wheel is built from a copy of the source tree (never from the checkout itself, whose
build/ folder could carry modules that no longer exist), installed with its dependencies
into a venv of its own (llama-cpp-python comes from pip's cache, which `make setup` filled),
and served from a folder outside the checkout, so that nothing can be imported from it: the
test checks where each package and the worker's llama.cpp library were loaded from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import psutil
import pytest

from tests.e2e.conftest import ROOT, start_server, stop_server

PACKAGES = ("corral", "router", "supervisor", "worker")
# llama-cpp-python builds from source (about 5 minutes) only when pip's cache lacks it.
INSTALL_LIMIT_S = 120
CONFIG = """
[server]
port = {PORT}

[models.demo]
path = "{MODEL}"
aliases = ["small"]
slots = 1
n_ctx = 512
chat_template = "gemma"
"""


@dataclass
class Installed:
    wheel: Path
    venv: Path
    outside: Path  # a folder outside the checkout, to run from
    build_s: float
    install_s: float


def source_files(root: Path) -> list[str]:
    """The files of the four packages, relative to the tree: what the wheel must carry,
    Python or not (templates, static files)."""
    out = []
    for package in PACKAGES:
        for path in (root / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out.append(path.relative_to(root).as_posix())
    return sorted(out)


def copy_source(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in ("pyproject.toml", "README.md", *PACKAGES):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def run(argv: list[str], cwd: Path, timeout: float) -> str:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    assert r.returncode == 0, f"{argv}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def clean_env() -> dict[str, str]:
    # Nothing may point Python back at the checkout.
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, venv, outside = tmp / "src", tmp / "dist", tmp / "venv", tmp / "elsewhere"
    outside.mkdir()
    src.mkdir()
    copy_source(src)
    t0 = time.monotonic()
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], tmp, 300)
    build_s = time.monotonic() - t0
    (wheel,) = dist.glob("corral-*.whl")
    t0 = time.monotonic()
    # A venv without pip of its own (ensurepip costs seconds); this pip installs into it,
    # with its dependencies, through the same pip cache.
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, 60)
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
         str(wheel)], outside, 600)
    install_s = time.monotonic() - t0
    yield Installed(wheel, venv, outside, build_s, install_s)


def test_the_wheel_carries_every_package_file_and_the_entry_point(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    expected = source_files(ROOT)
    assert expected and "worker/__main__.py" in expected
    missing = [f for f in expected if f not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert not [n for n in names if n.startswith("tests/")]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(installed.wheel).read(entry_points).decode()
    assert "corral = corral.main:main" in text


def test_installing_did_not_rebuild_llama_cpp(installed: Installed) -> None:
    print(f"wheel built in {installed.build_s:.1f} s, venv + install in {installed.install_s:.1f} s")
    assert installed.install_s < INSTALL_LIMIT_S, (
        f"install took {installed.install_s:.0f} s: llama-cpp-python was probably built again "
        "(run `make setup` once so that pip caches its wheel)"
    )


def test_everything_is_imported_from_the_venv(installed: Installed) -> None:
    out = run(
        [str(installed.venv / "bin" / "python"), "-c",
         "import corral, router, supervisor, worker, llama_cpp\n"
         "for m in (corral, router, supervisor, worker, llama_cpp): print(m.__file__)"],
        installed.outside, 60,
    )
    files = out.split()
    assert len(files) == 5
    for f in files:
        assert Path(f).is_relative_to(installed.venv), files
    version = run([str(installed.venv / "bin" / "corral"), "--version"], installed.outside, 60)
    assert version.strip() == "corral 0.1.0"


def test_corral_serve_runs_from_the_installed_wheel(
    installed: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        monkeypatch.delenv(name, raising=False)
    t0 = time.monotonic()
    srv = start_server(
        installed.outside, CONFIG, command=[str(installed.venv / "bin" / "corral")],
        cwd=installed.outside,
    )
    healthy_s = time.monotonic() - t0
    try:
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
        models = httpx.get(srv.base + "/models", timeout=10)
        assert models.status_code == 200
        assert {m["id"] for m in models.json()["data"]} >= {"demo"}
        # A completion loads the model in a worker, which must also be the venv's.
        t0 = time.monotonic()
        r = httpx.post(srv.base + "/completions", json={"model": "small", "prompt": "Hi", "max_tokens": 2},
                       timeout=120)
        first_answer_s = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
        print(f"healthy after {healthy_s:.1f} s; first answer (model load included) {first_answer_s:.1f} s")
        (pid,) = srv.workers().values()
        worker = psutil.Process(pid)
        assert Path(worker.cmdline()[0]).is_relative_to(installed.venv), worker.cmdline()
        assert worker.cwd() == str(installed.outside)
        libs = [m.path for m in worker.memory_maps() if "libllama" in m.path]
        assert libs and all(Path(p).is_relative_to(installed.venv) for p in libs), libs
        assert Path(psutil.Process(srv.process.pid).cmdline()[0]).is_relative_to(installed.venv)
    finally:
        assert stop_server(srv) == 0, srv.log_text()
