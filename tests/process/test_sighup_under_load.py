"""The whole server (`corral serve`'s own serve(), hypercorn, the real signal handling) with
fake workers: a real SIGHUP under a steady HTTP load on model a, with b added and c changed,
fails no request on a and leaves a's worker alone (same PID)."""

from __future__ import annotations

import json
import os
import signal
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from corral.serve import serve
from supervisor.config import load
from tests.e2e.conftest import free_port
from tests.harness import write_config
from tests.process.support import WORKER_COMMAND, StartLog, expected_text, wait_for


async def stream_text(client: httpx.AsyncClient, model: str, max_tokens: int) -> str:
    """One streamed completion; raises on anything but a clean stream ending in [DONE]."""
    body = {"model": model, "prompt": "x", "max_tokens": max_tokens, "stream": True}
    parts: list[str] = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                continue
            event = json.loads(data)
            assert "error" not in event, event
            parts.append(event["choices"][0]["text"])
        assert done, "stream ended without [DONE]"
    return "".join(parts)


async def listed_models(client: httpx.AsyncClient) -> list[str]:
    r = await client.get("/v1/models")
    assert r.status_code == 200
    return [m["id"] for m in r.json()["data"]]


async def model_pids(client: httpx.AsyncClient) -> dict[str, int | None]:
    r = await client.get("/admin/models")
    assert r.status_code == 200
    return {m["name"]: m["pid"] for m in r.json()["models"]}


async def test_sighup_under_load_spares_the_unchanged_model(
    tmp_path: Path, start_log: StartLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "200")
    cfg_path = tmp_path / "config.toml"
    port = free_port()
    write_config(cfg_path, {"a": {}, "c": {"slots": 2}}, server={"port": port})
    served = {"a": 0}
    failures: list[str] = []

    async def steady_load(client: httpx.AsyncClient, stop: trio.Event) -> None:
        while not stop.is_set():
            try:
                text = await stream_text(client, "a", 12)
                assert text == expected_text(12), text
                served["a"] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted, not raised
                failures.append(repr(exc))

    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, load(cfg_path), worker_command=WORKER_COMMAND))
            async with httpx.AsyncClient(base_url=binds[0].replace("[::]", "127.0.0.1"), timeout=20) as client:
                assert await stream_text(client, "c", 2) == expected_text(2)
                assert await stream_text(client, "a", 2) == expected_text(2)
                before = await model_pids(client)
                stop = trio.Event()
                async with trio.open_nursery() as load_nursery:
                    for _ in range(4):  # more streams than a's 4 slots: some always queue
                        load_nursery.start_soon(steady_load, client, stop)
                    await wait_for(lambda: served["a"] >= 8, 10, "load on a")
                    write_config(cfg_path, {"a": {}, "b": {}, "c": {"slots": 3}}, server={"port": port})
                    at_reload = served["a"]
                    os.kill(os.getpid(), signal.SIGHUP)
                    with trio.fail_after(5):
                        while "b" not in await listed_models(client):
                            await trio.sleep(0.05)
                    # b is new: its first request loads it while a keeps serving.
                    assert await stream_text(client, "b", 3) == expected_text(3)
                    await wait_for(lambda: served["a"] >= at_reload + 16, 10, "load on a after the reload")
                    stop.set()
                after = await model_pids(client)
                assert failures == []
                assert after["a"] == before["a"] is not None  # a's worker never changed
                assert after["c"] is None  # c drained and stopped; the next request restarts it
                assert await stream_text(client, "c", 2) == expected_text(2)
                assert (await model_pids(client))["c"] not in (None, before["c"])
            os.kill(os.getpid(), signal.SIGTERM)  # graceful shutdown ends serve()
    assert start_log.names().count("a") == 1
