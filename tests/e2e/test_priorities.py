"""Issue 44, on the demo model: a one-slot model busy with a batch key's request, four more
of them waiting, and an interactive key's request arriving last is served at once, the
running batch request parked (its cells kept) and resumed after it; a second batch key's
one request waits for one of the first key's, not all of them.

Before: the slot line was first come, first served, so the interactive request waited for
every batch request ahead of it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.e2e.conftest import Server, start_server, stop_server
from tests.secrets import secret

BATCH, OTHER, CHAT, ADMIN = (secret(n) for n in ("prio-e2e-batch", "prio-e2e-other", "prio-e2e-chat", "prio-e2e-admin"))

CONFIG = f"""
[server]
port = {{PORT}}
api_keys = [
  {{ key = "{BATCH}", name = "jobs", priority = "batch" }},
  {{ key = "{OTHER}", name = "more-jobs", priority = "batch" }},
  {{ key = "{CHAT}", name = "chat", priority = "interactive" }},
]
admin_keys = ["{ADMIN}"]

[models.gemma]
path = "{{MODEL}}"
chat_template = "gemma"
slots = 1
n_ctx = 1024
spec_type = "none"  # a token a step: n-gram drafts would end the long request too soon

[supervisor]
health_interval = 1  # the worker's counters (/metrics) a second old at most
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("priorities"), CONFIG)
    yield srv
    assert stop_server(srv) == 0


def _h(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _model(srv: Server) -> dict[str, Any]:
    r = httpx.get(srv.url + "/admin/models", headers=_h(ADMIN), timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json()["models"][0])


def _parked(srv: Server, at_least: float = 0.0) -> float:
    """The model's requests parked for a better class so far (GET /metrics, from the
    worker's last ping: waited for until it says `at_least`)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        text = httpx.get(srv.url + "/metrics", headers=_h(ADMIN), timeout=30).text
        for line in text.splitlines():
            if line.startswith('corral_model_prompt_cache_requests_parked_total{model="gemma"}'):
                if (n := float(line.split()[-1])) >= at_least:
                    return n
        time.sleep(0.2)
    raise AssertionError(f"corral_model_prompt_cache_requests_parked_total for gemma never reached {at_least}")


def test_an_interactive_request_is_served_before_a_batch_keys_waiting_ones(server: Server) -> None:
    srv = server
    done: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()

    def ask(name: str, key: str, tokens: int) -> None:
        body = {
            "model": "gemma", "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
        }
        r = httpx.post(srv.base + "/chat/completions", json=body, headers=_h(key), timeout=300)
        with lock:
            (done if r.status_code == 200 else failures).append(name if r.status_code == 200 else r.text)

    def send(name: str, key: str, tokens: int = 8) -> threading.Thread:
        """Send, and return once the request is in the line (or, the first, in the slot)."""
        before = _model(srv)["waiting"]
        t = threading.Thread(target=ask, args=(name, key, tokens))
        t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = _model(srv)
            if m["waiting"] > before or (name == "b0" and (m["slots_busy"] == 1 or done[-1:] == ["b0"])):
                return t
            time.sleep(0.02)
        raise AssertionError(f"{name} never reached the line: {_model(srv)}")

    # The interactive key has used the model: lower classes are not handed to the worker
    # ahead of a free slot while it may come again (supervisor/slot_order.py, SEEN_LATELY).
    ask("warm", CHAT, 1)
    threads = [send("b0", BATCH, 240)]  # holds the slot for some seconds
    threads += [send(f"b{i}", BATCH) for i in range(1, 5)]
    threads += [send("other", OTHER)]
    m = _model(srv)
    assert m["waiting_by_priority"] == {"interactive": 0, "normal": 0, "batch": 5}, m
    parked = _parked(srv)
    threads += [threading.Thread(target=ask, args=("chat", CHAT, 8))]
    threads[-1].start()
    assert done == ["warm"], "b0 ended before the line was formed: give it more tokens"
    for t in threads:
        t.join(300)
    assert failures == []
    # The interactive request took b0's slot at once, b0 parked with its cells; b0 then
    # resumed, and the batch keys took turns.
    assert done == ["warm", "chat", "b0", "b1", "other", "b2", "b3", "b4"]
    assert _parked(srv, parked + 1) == parked + 1
    assert _model(srv)["waiting_by_priority"] == {"interactive": 0, "normal": 0, "batch": 0}
