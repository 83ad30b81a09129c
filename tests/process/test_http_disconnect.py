"""A client that hangs up while its request waits for room really leaves the load queue:
the real app served by hypercorn on a socket, fake worker processes, httpx as the client."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.process.support import StartLog, make_supervisor, serving_http, wait_for


async def test_a_waiter_whose_client_disconnects_leaves_the_queue(
    tmp_path: Path, start_log: StartLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC__a", "2")  # a's request runs for a minute
    sup = make_supervisor(tmp_path, {"a": {}, "b": {}}, max_loaded_models=1, load_wait=60)
    with trio.fail_after(30):
        async with serving_http(sup) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                body = {"prompt": "x", "max_tokens": 120, "stream": True}
                async with client.stream("POST", "/v1/completions", json={**body, "model": "a"}) as r:
                    assert r.status_code == 200
                    chunks = r.aiter_bytes()  # kept: a collected iterator closes the stream
                    await chunks.__anext__()  # a is loaded and busy

                    async def ask_b() -> None:
                        await client.post("/v1/completions", json={"model": "b", "prompt": "x"})

                    with trio.move_on_after(1.0):  # the client of b gives up after 1 s
                        async with trio.open_nursery() as asker:
                            asker.start_soon(ask_b)
                            await wait_for(lambda: sup.admission.queued() == ["b"], 5, "b queued")
                            await trio.sleep_forever()
                    # Well before load_wait (60 s), b's request is gone from the queue.
                    await wait_for(lambda: sup.admission.queued() == [], 3, "b leaving the queue")
                    assert sup.resolve("b").in_flight == 0
                    assert sup.resolve("a").in_flight == 1  # a's stream went on throughout
            assert start_log.names() == ["a"]
