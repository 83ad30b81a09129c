"""A model file that no retry can load goes straight to `failed`: no backoff, no retries.

The config check reads every model's header, but a file can change after it: deleted,
replaced by something that is not a GGUF file, or cut short by a copy still running.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio

from router.app import create_app
from supervisor.lifecycle import State
from tests.harness import write_gguf
from tests.process.support import StartLog, make_supervisor, running


def _break(gguf: Path, how: str) -> None:
    if how == "missing":
        gguf.unlink()
    elif how == "not a gguf":
        gguf.write_text("<html>502 Bad Gateway</html>\n")
    else:  # truncated: the header promises a value that is not there
        gguf.write_bytes(gguf.read_bytes()[:-2])


@pytest.mark.parametrize(("how", "reason"), [
    ("missing", "no such file"),
    ("not a gguf", "not a GGUF model file (no GGUF magic)"),
    ("truncated", "not a GGUF model file (truncated header)"),
])
async def test_an_unloadable_file_fails_at_once_and_says_why(tmp_path: Path, how: str, reason: str) -> None:
    # With retries, the first would come after backoff_base = 30 s: far past the deadline.
    sup = make_supervisor(tmp_path, {"m": {}}, start_retries=3, backoff_base=30.0)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(10):
        async with running(sup):
            # Loaded once, then unloaded: the file breaks while the model is stopped.
            assert (await client.post("/admin/models/m/load")).status_code == 200
            assert (await client.post("/admin/models/m/unload")).status_code in (200, 202)
            h = sup.handles["m"]
            await h.wait_for_state(State.STOPPED)
            _break(tmp_path / "dummy.gguf", how)
            r = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
            body = await r.get_json()
            # No second worker was started for it.
            assert (r.status_code, h.state, h.failures, h.starts) == (503, State.FAILED, 1, 1)
            assert h.last_error == f"the model file cannot load: {reason}"
            assert reason in body["error"]["message"] and str(tmp_path) not in body["error"]["message"]
            # Mended, a reset loads it.
            write_gguf(tmp_path / "dummy.gguf")
            r = await client.post("/admin/models/m/reset")
            assert (await r.get_json())["reset"] is True
            r = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
            assert r.status_code == 200 and h.state is State.READY


async def test_a_file_that_breaks_during_a_backoff_fails_before_the_retry_starts_a_worker(
    tmp_path: Path, start_log: StartLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL_LOAD", "out of memory")  # a failure a retry might cure
    sup = make_supervisor(tmp_path, {"m": {}}, start_retries=3, backoff_base=0.5)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(10):
        async with running(sup):
            h = sup.handles["m"]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.post, "/v1/completions", json={"model": "m", "prompt": "x"}))
                await h.wait_for_state(State.BACKOFF)
                _break(tmp_path / "dummy.gguf", "missing")
                await h.wait_for_state(State.FAILED)
            assert (h.starts, h.unloadable, h.last_error) == (1, True, "the model file cannot load: no such file")
            assert len(start_log.entries()) == 1  # the retry spawned nothing
