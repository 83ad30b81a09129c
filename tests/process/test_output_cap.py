"""Issue 40, finding 5: a cap on output per model (`max_tokens_limit`) and per key (the
key's `max_tokens`), as llama-server's -n caps n_predict. A request that asks more, or no
limit, generates up to the lower cap and ends as a length-cut answer does in its dialect;
it is never a 400 (Claude Code sends max_tokens 32000 by default). Every dialect's name
for the limit goes through the same cap. Real app and supervisor, fake workers (which
generate exactly the limit they are sent, 8 when none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Awaitable, Callable

import trio

from router.app import create_app
from supervisor.config import parse
from supervisor.supervisor import Supervisor
from tests.harness import config_text, running, write_gguf
from tests.process.support import WORKER_COMMAND
from tests.secrets import secret

WIDE = secret("cap-wide")
NARROW = secret("cap-narrow")  # max_tokens = 3
ADMIN = secret("cap-admin")
REMOTE = {"client": ("10.1.2.3", 40000)}
HI = [{"role": "user", "content": "hello there"}]

# More than any cap here, and few enough that the fake, uncapped, answers it at once (an
# agent asks far more: Claude Code 32,000; the last test sends that).
MORE = 40
# (route, body, how many tokens the answer says it generated, whether it says it was cut)
Reading = Callable[[Any], tuple[int, bool]]
DIALECTS: list[tuple[str, dict[str, Any], Reading]] = [
    ("/v1/chat/completions", {"messages": HI, "max_tokens": MORE},
     lambda j: (j["usage"]["completion_tokens"], j["choices"][0]["finish_reason"] == "length")),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": MORE},
     lambda j: (j["usage"]["completion_tokens"], j["choices"][0]["finish_reason"] == "length")),
    ("/v1/chat/completions", {"messages": HI},  # no limit asked
     lambda j: (j["usage"]["completion_tokens"], j["choices"][0]["finish_reason"] == "length")),
    ("/v1/completions", {"prompt": "hi", "max_tokens": MORE},
     lambda j: (j["usage"]["completion_tokens"], j["choices"][0]["finish_reason"] == "length")),
    ("/completion", {"prompt": "hi", "n_predict": -1},
     lambda j: (j["tokens_predicted"], j["stop_type"] == "limit")),
    ("/api/chat", {"messages": HI, "stream": False, "options": {"num_predict": MORE}},
     lambda j: (j["eval_count"], j["done_reason"] == "length")),
    ("/api/generate", {"prompt": "hi", "stream": False, "options": {"num_predict": -1}},
     lambda j: (j["eval_count"], j["done_reason"] == "length")),
    ("/v1/messages", {"messages": HI, "max_tokens": MORE},
     lambda j: (j["usage"]["output_tokens"], j["stop_reason"] == "max_tokens")),
    ("/v1/responses", {"input": "hello there", "max_output_tokens": MORE},
     lambda j: (j["usage"]["output_tokens"], j["status"] == "incomplete")),
]


def _supervisor(tmp_path: Path, **capped: object) -> Supervisor:
    write_gguf(tmp_path / "dummy.gguf")
    keys = [{"key": WIDE, "name": "wide"}, {"key": NARROW, "name": "narrow", "max_tokens": 3}]
    text = config_text({"capped": capped, "open": {}}, {"api_keys": keys, "admin_keys": [ADMIN]})
    return Supervisor(parse(text, tmp_path), worker_command=WORKER_COMMAND)


Ask = Callable[[str, str, str, dict[str, Any], Reading], Awaitable[tuple[int, bool]]]


def _asking(sup: Supervisor) -> Ask:
    client = create_app(sup, sup.config).test_client()

    async def ask(key: str, model: str, path: str, body: dict[str, Any], read: Reading) -> tuple[int, bool]:
        r = await client.post(path, json={"model": model, **body}, headers={"x-api-key": key}, scope_base=REMOTE)
        assert r.status_code == 200, (path, body, await r.get_data())
        return read(await r.get_json())

    return ask


async def test_a_keys_max_tokens_caps_every_dialect(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path)
    ask = _asking(sup)
    with trio.fail_after(60):
        async with running(sup):
            for path, body, read in DIALECTS:
                assert await ask(NARROW, "open", path, body, read) == (3, True), (path, body)
            # A request asking less than the cap gets what it asked; another key, no cap.
            chat = DIALECTS[0][2]
            assert await ask(NARROW, "open", "/v1/chat/completions", {"messages": HI, "max_tokens": 2}, chat) == (2, True)
            assert await ask(WIDE, "open", "/v1/chat/completions", {"messages": HI, "max_tokens": 12}, chat) == (12, True)
            # Without any cap, no limit asked: the fake stops at 8 by itself.
            native = DIALECTS[4][2]
            assert await ask(WIDE, "open", "/completion", {"prompt": "hi", "n_predict": -1}, native) == (8, True)


async def test_a_models_max_tokens_limit_caps_every_dialect_and_the_lower_cap_wins(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, max_tokens_limit=5)
    ask = _asking(sup)
    with trio.fail_after(60):
        async with running(sup):
            for path, body, read in DIALECTS:
                # The model's cap, for any key (admin keys included)...
                assert await ask(WIDE, "capped", path, body, read) == (5, True), (path, body)
                assert await ask(ADMIN, "capped", path, body, read) == (5, True), (path, body)
                # ...and the key's, where it is lower.
                assert await ask(NARROW, "capped", path, body, read) == (3, True), (path, body)
            chat = DIALECTS[0][2]
            assert await ask(WIDE, "capped", "/v1/chat/completions", {"messages": HI, "max_tokens": 2}, chat) == (2, True)
            # llama-server reports the n_predict it ran with: the cut one.
            settings = lambda j: (j["generation_settings"]["n_predict"], j["stop_type"] == "limit")  # noqa: E731
            assert await ask(WIDE, "capped", "/completion", {"prompt": "hi", "n_predict": 400}, settings) == (5, True)
            # Claude Code's default max_tokens: cut, not refused.
            claude = {"messages": HI, "max_tokens": 32000}
            assert await ask(WIDE, "capped", "/v1/messages", claude, DIALECTS[7][2]) == (5, True)
