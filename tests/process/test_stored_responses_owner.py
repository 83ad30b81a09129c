"""Stored responses (POST /v1/responses with `store`) belong to the key that made them, by
its identity, not by its name: issue 40, finding 3. And what one key stores is bounded so
that it cannot push out another key's (finding 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from router.app import create_app
from supervisor.config import Config, ConfigError, parse
from supervisor.supervisor import Supervisor
from tests.harness import config_text, running, write_gguf
from tests.process.support import WORKER_COMMAND
from tests.secrets import secret

FIRST = secret("first")
SECOND = secret("second")
ROTATED = secret("rotated")
ADMIN = secret("admin")
REMOTE = {"client": ("10.1.2.3", 40000)}


def _write(tmp_path: Path, api_keys: list[Any]) -> Config | None:
    """Write the config; the parsed config, or None when it is refused."""
    write_gguf(tmp_path / "dummy.gguf")
    text = config_text({"a": {}}, {"api_keys": api_keys, "admin_keys": [ADMIN]})
    path = tmp_path / "config.toml"
    path.write_text(text)
    try:
        cfg = parse(text, tmp_path)
    except ConfigError:
        return None
    return Config(cfg.server, cfg.supervisor, cfg.models, path, cfg.keys)


def _first(tmp_path: Path) -> Config:
    cfg = _write(tmp_path, [FIRST])
    assert cfg is not None
    return cfg


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def _create(client: Any, key: str, **extra: Any) -> Any:
    body = {"model": "a", "input": "hi", "max_output_tokens": 4, **extra}
    return await client.post("/v1/responses", json=body, headers=_bearer(key), scope_base=REMOTE)


async def test_a_key_rotated_in_at_the_same_place_does_not_read_the_old_keys_responses(tmp_path: Path) -> None:
    # An unnamed key is named by its place (`api_keys[0]`); ownership by that name gave the
    # key that replaced it there the old key's responses.
    sup = Supervisor(_first(tmp_path), worker_command=WORKER_COMMAND)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            r = await _create(client, FIRST)
            assert r.status_code == 200, await r.get_data()
            rid = (await r.get_json())["id"]
            assert (await client.get(f"/v1/responses/{rid}", headers=_bearer(FIRST), scope_base=REMOTE)).status_code == 200
            _write(tmp_path, [ROTATED])
            assert (await client.post("/admin/reload", headers=_bearer(ADMIN), scope_base=REMOTE)).status_code == 200
            for method in (client.get, client.delete):
                r = await method(f"/v1/responses/{rid}", headers=_bearer(ROTATED), scope_base=REMOTE)
                assert r.status_code == 404
            r = await _create(client, ROTATED, previous_response_id=rid)
            assert r.status_code == 404 or (r.status_code == 400 and b"previous_response_id" in await r.get_data())


async def test_a_second_key_given_the_first_keys_generated_name_is_refused(tmp_path: Path) -> None:
    sup = Supervisor(_first(tmp_path), worker_command=WORKER_COMMAND)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            rid = (await (await _create(client, FIRST)).get_json())["id"]
            _write(tmp_path, [FIRST, {"key": SECOND, "name": "api_keys[0]"}])
            r = await client.post("/admin/reload", headers=_bearer(ADMIN), scope_base=REMOTE)
            assert r.status_code == 400 and b"api_keys[1].name" in await r.get_data()
            # The reload was refused: SECOND is no key at all, and FIRST still reads its own.
            assert (await client.get(f"/v1/responses/{rid}", headers=_bearer(SECOND), scope_base=REMOTE)).status_code == 401
            assert (await client.get(f"/v1/responses/{rid}", headers=_bearer(FIRST), scope_base=REMOTE)).status_code == 200


async def test_metadata_past_openais_bounds_is_a_400_naming_it(tmp_path: Path) -> None:
    sup = Supervisor(_first(tmp_path), worker_command=WORKER_COMMAND)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            for metadata, param in (
                ({f"k{i}": "v" for i in range(17)}, "metadata"),
                ({"k" * 65: "v"}, "metadata"),
                ({"note": "x" * 513}, "metadata.note"),
            ):
                r = await _create(client, FIRST, metadata=metadata)
                assert r.status_code == 400
                assert (await r.get_json())["error"]["param"] == param
                r = await client.post(
                    "/v1/chat/completions", headers=_bearer(FIRST), scope_base=REMOTE,
                    json={"model": "a", "messages": [{"role": "user", "content": "hi"}], "metadata": metadata},
                )
                assert r.status_code == 400 and (await r.get_json())["error"]["param"] == param
            r = await _create(client, FIRST, metadata={f"k{i}": "v" * 512 for i in range(16)})
            assert r.status_code == 200
