"""Priority classes and fair shares through the real server (hypercorn, fake workers):
whose request a busy one-slot model serves next, what /admin/models shows of the line, and
the 400s for a `priority` a key may not send, to a local model or relayed (issue 44)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from router.app import create_app
from supervisor.config import parse
from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor
from tests.harness import config_text, toml_value, write_gguf
from tests.process.support import WORKER_COMMAND, serving_http
from tests.process.test_upstream_relay import upstream_and_front
from tests.process.test_upstream_translation import OpenAIUpstream
from tests.secrets import secret

BATCH, INTERACTIVE, CHOOSER, ADMIN = (secret(n) for n in ("prio-batch", "prio-interactive", "prio-chooser", "prio-admin"))
KEYS = [
    {"key": BATCH, "name": "jobs", "priority": "batch"},
    {"key": INTERACTIVE, "name": "chat", "priority": "interactive"},
    {"key": CHOOSER, "name": "app", "request_priority": True},
]


def _supervisor(tmp_path: Path) -> Supervisor:
    write_gguf(tmp_path / "dummy.gguf")
    text = config_text({"one": {"slots": 1, "preload": True}}, {"api_keys": KEYS, "admin_keys": [ADMIN]})
    return Supervisor(parse(text, tmp_path), worker_command=WORKER_COMMAND)


def _h(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _chat(tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "one", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, **extra}


async def test_an_interactive_request_passes_a_batch_keys_line_and_a_second_key_shares_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")  # 4 tokens: a fifth of a second
    sup = _supervisor(tmp_path)
    handle = sup.handles["one"]
    done: list[str] = []
    with trio.fail_after(60):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=30) as c:
            await handle.wait_for_state(State.READY)

            async def ask(name: str, key: str, tokens: int = 4, **extra: Any) -> None:
                r = await c.post("/v1/chat/completions", json=_chat(tokens, **extra), headers=_h(key))
                assert r.status_code == 200, r.text
                done.append(name)

            async def joined(nursery: trio.Nursery, name: str, key: str, **extra: Any) -> None:
                """Send, and return once the request waits in the line."""
                before = handle.slot_queue.waiting
                nursery.start_soon(partial(ask, name, key, **extra))
                while handle.slot_queue.waiting == before:
                    await trio.sleep(0.01)

            await ask("warm", INTERACTIVE)  # interactive traffic is about
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, "b0", BATCH, 40)  # two seconds in the slot
                while handle.slot_queue.busy == 0:
                    await trio.sleep(0.01)
                for i in range(1, 5):
                    await joined(nursery, f"b{i}", BATCH)
                await joined(nursery, "app", CHOOSER, priority=5)  # batch too, by its own choice
                r = await c.get("/admin/models", headers=_h(ADMIN))
                assert r.json()["models"][0]["waiting_by_priority"] == {"interactive": 0, "normal": 0, "batch": 5}
                nursery.start_soon(ask, "chat", INTERACTIVE)
                assert done == ["warm"]
            # The interactive request at once: it took b0's slot, b0 going back to the front of
            # the batch class (worker/priority.py); then the batch class's two keys take turns.
            assert done == ["warm", "chat", "b0", "b1", "app", "b2", "b3", "b4"]


async def test_a_priority_the_key_may_not_choose_is_a_400_naming_it(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path)
    client = create_app(sup, sup.config).test_client()
    prompt = {"model": "one", "prompt": "hi", "max_tokens": 1}
    for path, body in (("/v1/chat/completions", _chat(1)), ("/v1/completions", prompt)):
        for key, sent in ((BATCH, 0), (BATCH, -1), (INTERACTIVE, 1), (CHOOSER, "high"), (CHOOSER, 1.5)):
            r = await client.post(path, json={**body, "priority": sent}, headers=_h(key))
            assert r.status_code == 400, (path, sent)
            error = (await r.get_json())["error"]
            assert error["param"] == "priority" and error["type"] == "invalid_request_error", error
    # Nothing was loaded for them.
    assert sup.handles["one"].state is State.STOPPED


async def test_a_relayed_body_carries_only_a_priority_its_key_may_send(tmp_path: Path) -> None:
    """An upstream (vLLM with priority scheduling, another Corral) reads `priority` as it
    comes, and knows nothing of this server's keys: the front checks it first."""
    tables = '[models.far]\nupstream = "{UP}"\n'
    keys = f"api_keys = {toml_value(KEYS)}"
    async with upstream_and_front(tmp_path, tables, server=keys, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(base_url=front, timeout=10) as c:
            body = {"model": "far", "messages": [{"role": "user", "content": "hi"}]}
            r = await c.post("/v1/chat/completions", json={**body, "priority": -1}, headers=_h(BATCH))
            assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
            assert fake.seen == []  # never reached the upstream
            r = await c.post("/v1/chat/completions", json={**body, "priority": -1}, headers=_h(CHOOSER))
            assert r.status_code == 200 and fake.seen[-1][1]["priority"] == -1
