"""llama-server's slot actions, POST /slots/{id}?action=save|restore|erase: the request
read and checked as its server-context.cpp does (handle_slots_action and its handlers),
the file name as its fs_validate_filename checks it (common/common.cpp), the answers in
its shape. The worker does the work (worker/slot_files.py)."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any, Literal

import msgspec
from quart import Blueprint, Response, request

from router.api.dialect import Server
from router.server import bodies
from supervisor.config.checks import resolve_path
from supervisor.errors import InvalidRequest, NotServed

Action = Literal["save", "restore", "erase"]
_FORBIDDEN = set('/\\:*?"<>|') | {"\uff0e", "\u2215", "\u2216", "\ufffd", "\ufeff"}


def valid_filename(name: str) -> bool:
    """A bare file name, as llama.cpp's fs_validate_filename admits one: not empty, at most
    255 bytes, no control character, no path separator or character Windows refuses, no
    `..`, no leading or trailing space, no trailing dot."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255 or name == ".":
        return False
    if ".." in name or name[0] == " " or name[-1] in " .":
        return False
    for ch in name:
        if ch in _FORBIDDEN or unicodedata.category(ch) in ("Cc", "Cs"):
            return False
    return True


_ACTIONS: dict[str, Action] = {"save": "save", "restore": "restore", "erase": "erase"}


def _body(body: bytes | bytearray, strict: bool) -> dict[str, Any]:
    """The JSON object sent, {} for none; not one is a 400 where the action reads it."""
    if not body.strip():
        return {}
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        if strict:
            raise InvalidRequest("The body is not valid JSON.", None) from None
        return {}
    if not isinstance(data, dict):
        if strict:
            raise InvalidRequest("The body must be a JSON object.", None)
        return {}
    return data


def register(app: Blueprint, server: Server) -> None:
    @app.post("/slots/<id_slot>")
    async def slot_action(id_slot: str) -> Response:
        config = server.supervisor.config
        if config.server.slot_save_path is None:
            raise NotServed(
                "This server does not support slots action. Start it with `--slot-save-path` "
                "(Corral: [server] slot_save_path)."
            )
        try:
            number = int(id_slot)
        except ValueError:
            raise InvalidRequest("Invalid slot ID", "id_slot") from None
        action = _ACTIONS.get(request.args.get("action", ""))
        if action is None:
            raise InvalidRequest("Invalid action", "action")
        data = _body(await bodies.read_body(), strict=action != "erase")  # erase reads none
        model = data.get("model")
        handle = server.resolve(model if isinstance(model, str) else request.args.get("model"))
        path = ""
        if action != "erase":
            filename = data.get("filename")
            if not isinstance(filename, str):
                raise InvalidRequest("'filename' is required: the slot file's name.", "filename")
            if not valid_filename(filename):
                raise InvalidRequest("Invalid filename", "filename")
            base = config.source.parent if config.source is not None else Path.cwd()
            path = str(resolve_path(config.server.slot_save_path, base) / filename)
        async with handle.lease() as conn:
            slots = conn.ready.slots if conn.ready is not None else 1
            if number < 0:
                raise InvalidRequest("Invalid slot ID", "id_slot")
            slot = number % slots  # llama-server wraps an id past the last slot
            result = await conn.slot_file(slot, action, path)
        out: dict[str, Any] = {"id_slot": result.slot}
        if action == "erase":
            out["n_erased"] = result.n_tokens
        elif action == "save":
            out.update(filename=Path(path).name, n_saved=result.n_tokens, n_written=result.n_bytes,
                       timings={"save_ms": result.ms})
        else:
            out.update(filename=Path(path).name, n_restored=result.n_tokens, n_read=result.n_bytes,
                       timings={"restore_ms": result.ms})
        return Response(msgspec.json.encode(out), status=200, content_type="application/json")
