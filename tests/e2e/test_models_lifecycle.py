"""Lazy loading with the real worker: nothing runs before the first request, one worker per
model, aliases share their model's worker, and SIGTERM stops everything."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import psutil

from tests.e2e.conftest import THREE_MODELS, start_server, stop_server


def test_three_models_start_lazily_one_worker_each(tmp_path: Path) -> None:
    srv = start_server(tmp_path, THREE_MODELS)
    try:
        client = openai.OpenAI(base_url=srv.base, api_key="unused")
        # /health and /v1/models must not load anything.
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
        listed = {m.id for m in client.models.list().data}
        assert listed == {"chat-a", "chat-b", "embed"}
        assert srv.workers() == {}

        msg = [{"role": "user", "content": "Hello"}]
        client.chat.completions.create(model="chat-a", messages=msg, max_tokens=4)
        first = srv.workers()
        assert set(first) == {"chat-a"}

        # The alias reuses chat-a's worker: same pid, no second process.
        client.chat.completions.create(model="a-alias", messages=msg, max_tokens=4)
        assert srv.workers() == first

        client.completions.create(model="chat-b", prompt="Hello", max_tokens=4)
        client.embeddings.create(model="embed", input="Hello")
        workers = srv.workers()
        assert set(workers) == {"chat-a", "chat-b", "embed"}
        assert workers["chat-a"] == first["chat-a"]
        assert srv.log_text().count("stopped -> starting") == 3

        pids = list(workers.values())
        # With no connection left open, hypercorn finishes its shutdown at once; the workers
        # must still be stopped gracefully after it (they were SIGKILLed in a race before
        # db7be2a: the HTTP task cancelled everything as soon as hypercorn returned).
        client.close()
    finally:
        code = stop_server(srv)
    assert code == 0
    log = srv.log_text()
    assert log.count("stopping -> stopped (worker exited)") == 3, log[-2000:]
    assert "(killed)" not in log
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
