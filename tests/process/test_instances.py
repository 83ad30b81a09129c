"""`instances = N` with fake workers (issue 43, item 3): several workers of one model served
as one name. A load keeps both busy; a conversation's turns land on the instance that holds
its prefix; one instance killed under load loses no request that had not started."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from router.app import create_app
from router.generation import instances
from supervisor.group import ModelGroup
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State
from tests.harness import make_config
from tests.process.support import StartLog, expected_text, make_supervisor, running, serving_http, wait_for


def _group(sup: Any) -> ModelGroup:
    group = sup.handles["m"]
    assert isinstance(group, ModelGroup)
    return group


async def _all_ready(group: ModelGroup) -> None:
    await wait_for(lambda: all(h.state is State.READY for h in group.instances), 10, "both instances ready")


@pytest.fixture
def served_on(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(session key, instance) of every request that started on an instance with a key."""
    seen: list[tuple[str, str]] = []
    remember = instances.remember

    def spy(group: ModelGroup, key: str, h: ModelHandle) -> None:
        seen.append((key, h.name))
        remember(group, key, h)

    monkeypatch.setattr(instances, "remember", spy)
    return seen


async def test_a_concurrent_load_keeps_both_instances_busy_each_with_half_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "50")
    sup = make_supervisor(tmp_path, {"m": {"instances": 2, "slots": 1, "preload": True}}, cores=8)
    group = _group(sup)
    client = create_app(sup, sup.config).test_client()
    statuses: list[int] = []
    busy: set[str] = set()

    async def one(i: int) -> None:
        body = {"model": "m", "prompt": f"request {i}", "max_tokens": 10}
        r = await client.post("/v1/completions", json=body)
        statuses.append(r.status_code)
        assert (await r.get_json())["choices"][0]["text"] == expected_text(10)

    async def watch() -> None:
        while True:
            busy.update(h.name for h in group.instances if h.conn is not None and h.conn.active > 0)
            await trio.sleep(0.01)

    with trio.fail_after(20):
        async with running(sup):
            await _all_ready(group)
            assert sorted(start_log.names()) == ["m", "m#1"]  # one worker each, own name
            # The cores are divided among the workers loaded together, instances included.
            await wait_for(lambda: [h.worker_threads for h in group.instances] == [4, 4], 5, "a share each")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                async with trio.open_nursery() as load:
                    for i in range(8):
                        load.start_soon(one, i)
                nursery.cancel_scope.cancel()
            assert statuses == [200] * 8
            assert busy == {"m", "m#1"}
            now = time.monotonic()
            assert all(h.requests.count(now) >= 2 for h in group.instances)
            r = await client.get("/v1/models")
            data = (await r.get_json())["data"]
            assert [m["id"] for m in data] == ["m"]  # one name, listed once
            assert [(i["instance"], i["state"]) for i in data[0]["instances"]] == [("m", "ready"), ("m#1", "ready")]
            stats = group.statistics()
            assert (stats.name, stats.state, stats.slots) == ("m", State.READY, 2)


async def test_a_conversations_turns_land_on_the_instance_that_holds_its_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served_on: list[tuple[str, str]], start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "100")
    sup = make_supervisor(tmp_path, {"m": {"instances": 2, "slots": 2, "preload": True}})
    group = _group(sup)
    client = create_app(sup, sup.config).test_client()
    system = {"role": "system", "content": "You are a terse assistant."}

    async def background(stop: trio.Event) -> None:
        i = 0
        while not stop.is_set():  # other conversations, one at a time, on either instance
            i += 1
            body = {"model": "m", "messages": [{"role": "user", "content": f"other {i}"}], "max_tokens": 5}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200

    with trio.fail_after(30):
        async with running(sup):
            await _all_ready(group)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(background, stop)
                messages: list[dict[str, str]] = [system, {"role": "user", "content": "first question"}]
                for turn in range(6):
                    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 4})
                    assert r.status_code == 200
                    reply = (await r.get_json())["choices"][0]["message"]["content"]
                    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"turn {turn}"}]
                # A client that names its session keeps to one instance too.
                for turn in range(4):
                    body = {"model": "m", "prompt": f"different {turn}", "max_tokens": 3}
                    r = await client.post("/v1/completions", json=body, headers={"x-session-id": "s-1"})
                    assert r.status_code == 200
                stop.set()
    conversations: dict[str, set[str]] = {}
    for key, label in served_on:
        conversations.setdefault(key, set()).add(label)
    start_keys = [k for k, n in conversations.items() if sum(key == k for key, _ in served_on) == 6]
    assert len(start_keys) == 1 and len(conversations[start_keys[0]]) == 1, conversations
    assert len(conversations["h:s-1"]) == 1
    assert {label for _, label in served_on} == {"m", "m#1"}  # the others spread over both


async def test_one_instance_killed_under_load_loses_no_request_that_had_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_log: StartLog
) -> None:
    # 20 tokens at 20 a second: each request runs for a second, one per slot.
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    sup = make_supervisor(tmp_path, {"m": {"instances": 2, "slots": 1, "preload": True}}, min_uptime=0)
    group = _group(sup)
    done: list[int] = []
    broken: list[int] = []
    statuses: list[int] = []

    async def one(c: httpx.AsyncClient, i: int) -> None:
        body = {"model": "m", "prompt": f"request {i}", "max_tokens": 20, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            statuses.append(r.status_code)
            events = [line[len("data: "):] async for line in r.aiter_lines() if line.startswith("data: ")]
        if events[-1] == "[DONE]":
            assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == expected_text(20)
            done.append(i)
        else:  # it had started: its stream committed, and it ends with the error
            assert json.loads(events[-1])["error"]["code"] == "worker_crashed" and len(events) > 1
            broken.append(i)

    with trio.fail_after(30):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=20) as c:
            await _all_ready(group)
            second = group.instances[1]
            async with trio.open_nursery() as load:
                for i in range(8):
                    load.start_soon(one, c, i)
                # Both running one, with more in line for each.
                await wait_for(
                    lambda: all(h.conn is not None and h.conn.active == 1 for h in group.instances)
                    and second.in_flight >= 2,
                    10, "a load on both instances",
                )
                (pid,) = start_log.pids("m#1")
                os.kill(pid, signal.SIGKILL)
            assert statuses == [200] * 8  # no request failed before its output began
            assert len(broken) <= 1  # only the one the killed worker was generating
            assert len(done) + len(broken) == 8
            assert group.failed_over >= 1  # those in line on m#1 went to m
            await wait_for(lambda: second.state is not State.READY, 5, "the crash noticed")


async def test_a_reload_that_changes_instances_keeps_the_worker_both_configs_have(
    tmp_path: Path, start_log: StartLog
) -> None:
    sup = make_supervisor(tmp_path, {"m": {"preload": True, "aliases": ["a"]}})
    h = sup.handles["m"]
    assert isinstance(h, ModelHandle)
    with trio.fail_after(20):
        async with running(sup):
            await wait_for(lambda: h.state is State.READY, 10, "m ready")
            pid = h.pid
            sup.reload(make_config(tmp_path, {"m": {"preload": True, "aliases": ["a"], "instances": 2}}))
            group = _group(sup)
            assert group.instances[0] is h and sup.resolve("a") is group
            await wait_for(lambda: group.instances[1].state is State.READY, 10, "m#1 preloaded")
            sup.reload(make_config(tmp_path, {"m": {"preload": True, "aliases": ["a"]}}))
            assert sup.handles["m"] is h
            await wait_for(lambda: group.instances[1].finished.is_set(), 10, "m#1 retired")
            assert h.pid == pid and h.state is State.READY  # never restarted
            assert start_log.names() == ["m", "m#1"]


async def test_an_instance_removed_and_added_back_while_it_drains_is_taken_back(
    tmp_path: Path, start_log: StartLog
) -> None:
    """Not a second run loop under the same label beside the draining one: the load queue
    and the core shares are keyed by it."""
    sup = make_supervisor(tmp_path, {"m": {"preload": True, "instances": 2}})
    group = _group(sup)
    with trio.fail_after(20):
        async with running(sup):
            await _all_ready(group)
            second = group.instances[1]
            pid = second.pid
            async with second.lease():  # a request in flight: the removed instance drains
                sup.reload(make_config(tmp_path, {"m": {"preload": True}}))
                await wait_for(lambda: second.state is State.DRAINING, 5, "m#1 draining")
                sup.reload(make_config(tmp_path, {"m": {"preload": True, "instances": 2}}))
                assert _group(sup).instances[1] is second
            await wait_for(lambda: second.state is State.READY, 5, "m#1 serving again")
            assert second.pid == pid and sorted(start_log.names()) == ["m", "m#1"]  # no start since


async def test_slot_actions_on_a_model_of_several_instances_are_refused_naming_id_slot(tmp_path: Path) -> None:
    """A slot id names one worker's slot; with two instances a save or restore could act on
    the other one's (someone else's cache): a 400 naming id_slot, nothing written."""
    from supervisor.config import parse
    from supervisor.supervisor import Supervisor
    from tests.harness import config_text, write_gguf
    from tests.process.support import WORKER_COMMAND

    write_gguf(tmp_path / "dummy.gguf")
    (tmp_path / "slots").mkdir()
    config = parse(config_text({"m": {"instances": 2, "slots": 1}}, {"slot_save_path": "slots"}), tmp_path)
    sup = Supervisor(config, worker_command=WORKER_COMMAND)
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/slots/0?action=save", json={"filename": "a.bin"})
        assert r.status_code == 400
        body = await r.get_json()
        assert body["error"]["message"].startswith("Slot actions act on one worker's slots") and "2 instances" in body["error"]["message"]
        assert list((tmp_path / "slots").iterdir()) == []
