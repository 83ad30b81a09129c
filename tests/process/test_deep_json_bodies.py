"""JSON nested 50,000 deep is a 400 in the route's own dialect on every POST route, with an
`upstream` model in the config or without one (issue 40, finding 2).

The upstream hook (router/upstream/routing.py) read every POST body with a decode of its own
that caught DecodeError only, so with any upstream in the config the RecursionError escaped
as `500 internal error: RecursionError` on every route it looks at; llama-server's slot
actions and LoRA list decoded the same way without upstreams. Every body reader now goes
through router/server/json_body.py.

The walk takes its routes from the app's url_map, so a route added later is walked too: it
must refuse the body with a 400, or be listed in `_reads_no_body` and answer it exactly as
it answers an empty body.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from quart_trio import QuartTrio

from router.app import create_app, dialect_of
from supervisor.config import parse
from supervisor.supervisor import Supervisor
from tests.harness import write_gguf
from tests.process.support import WORKER_COMMAND

N = 50_000
DEEP_ARRAY = b"[" * N + b"]" * N
DEEP_OBJECT = b'{"a":' * N + b"1" + b"}" * N


def _in_a_message(model: str) -> bytes:
    """The issue's body: valid JSON, nested inside an unknown field of a message."""
    return (
        b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", "content": "hi", "x": '
        + DEEP_ARRAY + b"}]}"
    )


def _bodies(model: str) -> dict[str, bytes]:
    return {
        "in a message": _in_a_message(model),
        # Before `model`: the upstream hook skips it to find the model.
        "before model": b'{"x": ' + DEEP_OBJECT + b', "model": "' + model.encode() + b'"}',
        "unclosed": b"[" * N,  # not JSON either, but the decoder recurses before it finds out
    }


# Path variables: slot 0, and a model that does not exist, so that the walk loads nothing.
_VALUES = {"id_slot": "0", "name": "no-such"}
# A slot action reads its body only once its id and action are known. Erase needs no body
# (llama-server reads none), so one it cannot read is ignored: it is sent for a model that
# does not exist, so that it answers without loading one.
_QUERIES = {"/slots/<id_slot>": ("action=save", "action=restore", "action=erase&model=no-such")}


def _reads_no_body(rule: str, query: str) -> bool:
    """The requests whose answer does not depend on a body they cannot read."""
    return (
        rule in ("/props", "/tools", "/cors-proxy")  # llama-server's answers with the feature off
        or rule.startswith("/admin/")  # Corral's admin actions take no body
        or "action=erase" in query
    )


def _supervisor(tmp_path: Path, upstreams: bool) -> Supervisor:
    write_gguf(tmp_path / "m.gguf")
    (tmp_path / "slots").mkdir(exist_ok=True)
    text = '[server]\nslot_save_path = "slots"\n\n[models.m]\npath = "m.gguf"\n'
    if upstreams:  # never reached: every request here is refused before it would be relayed
        text += '\n[models.up]\nupstream = "http://127.0.0.1:9/v1"\n'
    cfg = parse(text, tmp_path)
    return Supervisor(cfg, worker_command=WORKER_COMMAND)


def _targets(app: QuartTrio) -> list[tuple[str, str]]:
    """(rule, path with its query) for every POST the app routes."""
    out = []
    for rule in app.url_map.iter_rules():
        if "POST" not in (rule.methods or ()):
            continue
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", lambda m: _VALUES[m.group(1)], rule.rule)
        out += [(rule.rule, f"{path}?{q}" if q else path) for q in _QUERIES.get(rule.rule, ("",))]
    return out


def _message_in_dialect(dialect: str, status: int, body: Any) -> str:
    """The error's message, once the answer is checked to be in `dialect`'s error shape."""
    if dialect in ("openai", "responses"):
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}, body
        assert error["type"] == "invalid_request_error", body
    elif dialect == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        error = body["error"]
        assert error["type"] == "invalid_request_error", body
    elif dialect == "ollama":
        assert set(body) == {"error"} and isinstance(body["error"], str), body
        return str(body["error"])
    elif dialect == "llama":
        error = body["error"]
        assert error["code"] == status and error["type"] == "invalid_request_error", body
    else:
        pytest.fail(f"a dialect this test does not know the error shape of: {dialect}")
    return str(error["message"])


async def _post(client: Any, path: str, body: bytes) -> tuple[int, Any]:
    # Nothing here may load a model (the supervisor is not running): a request that tries
    # fails the test rather than hanging it.
    with trio.fail_after(10):
        r = await client.post(path, data=body, headers={"content-type": "application/json"})
        return r.status_code, msgspec.json.decode(await r.get_data())


@pytest.mark.parametrize("upstreams", [False, True], ids=["no upstreams", "an upstream model"])
async def test_deep_json_is_a_400_in_the_routes_dialect_on_every_post_route(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, upstreams: bool
) -> None:
    sup = _supervisor(tmp_path, upstreams)
    app = create_app(sup, sup.config)
    client = app.test_client()
    targets = _targets(app)
    # The walk sees every dialect's routes, the slot actions and LoRA list among them.
    assert {"/v1/chat/completions", "/v1/messages", "/v1/responses", "/api/chat", "/completion",
            "/apply-template", "/lora-adapters", "/slots/0?action=save"} <= {p for _, p in targets}
    refused = []
    with caplog.at_level(logging.INFO):
        for rule, path in targets:
            for name, body in _bodies("up" if upstreams else "m").items():
                status, answer = await _post(client, path, body)
                where = (path, name, status, answer)
                if _reads_no_body(rule, path.partition("?")[2]):
                    assert (status, answer) == await _post(client, path, b""), where
                    assert status != 500, where
                    continue
                assert status == 400, where
                _message_in_dialect(dialect_of(path).name, status, answer)
                refused.append(path)
    assert len(refused) > 100  # the table of routes that read no body is the exception
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# The routes whose request takes `messages` and whose message lets an unknown field through
# to the decoder, which names it.
MESSAGE_ROUTES = [
    "/v1/chat/completions", "/chat/completions", "/v1/chat/completions/input_tokens",
    "/v1/messages", "/v1/messages/count_tokens", "/api/chat", "/apply-template",
]


@pytest.mark.parametrize("path", MESSAGE_ROUTES)
async def test_deep_json_in_an_unknown_message_field_for_an_upstream_model_is_a_400_naming_it(
    tmp_path: Path, path: str
) -> None:
    """The issue's request: a model served upstream, a message with an unknown field
    holding 50,000 nested `[`. The route names the field, as it does for a local model
    (tests/unit/router/server/test_hostile_json.py)."""
    sup = _supervisor(tmp_path, upstreams=True)
    client = create_app(sup, sup.config).test_client()
    status, answer = await _post(client, path, _in_a_message("up"))
    assert status == 400, answer
    message = _message_in_dialect(dialect_of(path).name, status, answer)
    assert "messages[0].x" in message and "nested too deeply" in message, answer
    error = answer["error"]
    if isinstance(error, dict) and "param" in error:  # OpenAI's and llama-server's name it
        assert error["param"] == "messages[0].x", answer
