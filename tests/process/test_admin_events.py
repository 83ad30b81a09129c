"""GET /admin/events: a load's progress and `ready` reach a subscriber, and a subscriber
that stops reading slows nothing down (the real server on a socket, fake workers)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio

from supervisor.events import BUFFER, EventBus
from supervisor.supervisor import Supervisor
from tests.harness import make_config
from tests.process.support import WORKER_COMMAND, serving_http


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    name = None
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            event = json.loads(line[6:])
            assert event["type"] == name  # the SSE event name is the type
            yield event


async def test_a_subscriber_sees_a_load_progress_and_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_LOAD_DELAY", "0.3")
    sup = Supervisor(make_config(tmp_path, {"a": {}}), worker_command=WORKER_COMMAND)
    seen: list[dict[str, Any]] = []
    with trio.fail_after(30):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=10) as c:
            async with c.stream("GET", "/admin/events") as r:
                assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
                async with trio.open_nursery() as nursery:
                    events = _events(r)
                    snapshot = await events.__anext__()
                    assert snapshot["type"] == "snapshot"
                    assert [(m["name"], m["state"]) for m in snapshot["models"]] == [("a", "stopped")]
                    nursery.start_soon(c.post, "/admin/models/a/load")
                    async for event in events:
                        seen.append(event)
                        if event["type"] == "state" and event["state"] == "ready":
                            break
                    r2 = await c.post("/admin/models/a/unload")
                    assert r2.status_code == 202
                    async for event in events:
                        seen.append(event)
                        if event["type"] == "state" and event["state"] == "stopped":
                            break
    kinds = [(e["type"], e.get("state", e.get("progress"))) for e in seen]
    assert kinds[:4] == [("state", "starting"), ("load_progress", 0.0), ("load_progress", 1.0), ("state", "ready")]
    ready = seen[3]
    assert ready["model"] == "a" and ready["previous"] == "starting" and isinstance(ready["pid"], int)
    assert ("unloading", None) in kinds and kinds[-1] == ("state", "stopped")
    unloading = next(e for e in seen if e["type"] == "unloading")
    assert unloading["reason"] == "unloaded by an admin" and unloading["force"] is False


async def test_a_stalled_subscriber_does_not_block_the_server(tmp_path: Path) -> None:
    sup = Supervisor(make_config(tmp_path, {"a": {}}), worker_command=WORKER_COMMAND)
    with trio.fail_after(60):
        async with serving_http(sup) as base:
            host, port = base.removeprefix("http://").rsplit(":", 1)
            # A client that subscribes and never reads a byte.
            stalled = await trio.open_tcp_stream(host, int(port))
            await stalled.send_all(b"GET /admin/events HTTP/1.1\r\nHost: x\r\n\r\n")
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                async with c.stream("GET", "/admin/events") as live:
                    events = _events(live)
                    assert (await events.__anext__())["type"] == "snapshot"
                    # 20 MB of events: far more than the stalled socket's buffers hold.
                    padding = "x" * 1000
                    started = time.monotonic()
                    for i in range(20_000):
                        sup.events.publish("test", n=i, padding=padding)
                        if i % 500 == 0:
                            await trio.sleep(0)  # let the streams run
                    publishing = time.monotonic() - started
                    health = await c.get("/health")
                    assert health.status_code == 200
                    # The live reader keeps up, or is told what it lost; never stuck.
                    last = -1
                    async for event in events:
                        if event["type"] == "dropped":
                            assert event["count"] > 0
                        elif event["type"] == "test":
                            assert event["n"] > last
                            last = event["n"]
                            if last == 19_999:
                                break
            await stalled.aclose()
    assert publishing < 10  # never waited on a reader


def test_the_bus_keeps_a_bounded_buffer_per_subscriber_and_counts_what_it_drops() -> None:
    bus = EventBus()
    bus.publish("nobody", n=0)  # no subscriber: nothing kept
    slow = bus.subscribe()
    for i in range(BUFFER + 10):
        bus.publish("e", n=i)
    assert len(slow._events) == BUFFER and slow.dropped == 10

    async def read() -> list[dict[str, Any]]:
        return [await slow.next() for _ in range(2)]

    first, second = trio.run(read)
    assert first["type"] == "dropped" and first["count"] == 10
    assert second["n"] == 10  # the oldest that was kept
    slow.close()
    bus.publish("after", n=1)
    assert len(slow._events) == BUFFER - 1
