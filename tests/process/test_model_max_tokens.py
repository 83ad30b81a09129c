"""`[models.NAME] max_tokens`: the limit of a request that sets none, on every generating
route; a request's own limit, or llama-server's explicit n_predict = -1, still wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from router.app import create_app
from supervisor.config import ConfigError
from supervisor.supervisor import Supervisor
from tests.harness import make_config, running
from tests.process.support import WORKER_COMMAND

MESSAGES = [{"role": "user", "content": "hello there"}]


async def test_a_models_max_tokens_applies_where_the_request_sets_none(tmp_path: Path) -> None:
    sup = Supervisor(make_config(tmp_path, {"a": {"max_tokens": 3}, "b": {}}), worker_command=WORKER_COMMAND)
    client = create_app(sup, sup.config).test_client()

    async def tokens(path: str, body: dict[str, object]) -> int:
        r = await client.post(path, json=body)
        assert r.status_code == 200, await r.get_data()
        got = await r.get_json()
        return int(got["usage"]["completion_tokens"] if "usage" in got else got["tokens_predicted"])

    with trio.fail_after(30):
        async with running(sup):
            assert await tokens("/v1/chat/completions", {"model": "a", "messages": MESSAGES}) == 3
            assert await tokens("/v1/chat/completions", {"model": "a", "messages": MESSAGES, "max_tokens": 5}) == 5
            assert await tokens("/v1/chat/completions", {"model": "a", "messages": MESSAGES, "max_completion_tokens": 4}) == 4
            assert await tokens("/v1/completions", {"model": "a", "prompt": "hi"}) == 3
            assert await tokens("/completion", {"model": "a", "prompt": "hi"}) == 3
            # An explicit n_predict = -1 asks for no limit: the fake stops at 8 by itself.
            assert await tokens("/completion", {"model": "a", "prompt": "hi", "n_predict": -1}) == 8
            # Without the key: no limit for a chat, OpenAI's 16 for a legacy completion.
            assert await tokens("/v1/chat/completions", {"model": "b", "messages": MESSAGES}) == 8
            assert await tokens("/v1/completions", {"model": "b", "prompt": "hi"}) == 16


def test_max_tokens_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        make_config(tmp_path, {"a": {"max_tokens": 0}})
    assert exc.value.problems == ["models.a.max_tokens: must be at least 1, got 0"]
