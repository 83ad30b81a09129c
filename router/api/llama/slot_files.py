"""llama-server's slot actions, POST /slots/{id}?action=save|restore|erase: the request
read and checked as its server-context.cpp does (handle_slots_action and its handlers),
the file name as its fs_validate_filename checks it (common/common.cpp), the answers in
its shape. The worker does the work (worker/slot_files.py, worker/slot_folder.py).

Who may act (`acting`): with no key configured, anyone, as with llama-server. With keys,
slot actions are an operator's tool ([server] slot_actions = "admin", the default): a slot
holds whatever its last request left, another key's conversation included, and a restore
puts whatever a file holds into the cache. With slot_actions = "keys", every key that may
use the model may act, on its own terms: its files live in a folder of its own under
slot_save_path (named by its identity), and it may save or erase only a slot that holds
its own cache. A restored slot's cells serve the cache scope of the key that restored them
(router/server/cache_scope.py).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any, Literal

import msgspec
from quart import Blueprint, Response, request

from router.api.dialect import Server
from router.server import auth, bodies, json_body, steering
from router.server.cache_scope import cache_scope
from supervisor.config import Config
from supervisor.config.checks import resolve_path
from supervisor.config.keys import Key
from supervisor.errors import Forbidden, InvalidRequest, NotServed, Unsupported
from supervisor.group import ModelGroup
from worker.protocol import SlotFile

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
        data = json_body.decode_any(body, api="llama-server")
    except InvalidRequest:  # not JSON, not UTF-8, too deep: ignored where no body is needed
        if strict:
            raise
        return {}
    if not isinstance(data, dict):
        if strict:
            raise InvalidRequest("The body must be a JSON object.", None)
        return {}
    return data


# A key's own folder under slot_save_path: its identity's first half (Key.owner), which no
# other key shares and which says nothing of the key.
_OWN_FOLDER_CHARS = 32


def acting(config: Config, key: Key | None) -> str | None:
    """Whether the request's key may act on slots: None for any slot and the folder itself,
    or the name of the key's own folder (it may act only on its own cache). Raises
    Forbidden."""
    if steering.may_steer(config.keys, key):
        return None
    if config.server.slot_actions == "keys" and key is not None:
        return key.owner[:_OWN_FOLDER_CHARS]
    raise Forbidden(
        "Slot actions need an admin key on this server: a slot holds any key's cached "
        'conversation. An operator may let every key act on its own slots with [server] slot_actions = "keys".'
    )


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
        key = auth.current_key()
        own = acting(config, key)
        data = _body(await bodies.read_body(), strict=action != "erase")  # erase reads none
        model = data.get("model")
        handle = server.resolve(model if isinstance(model, str) else request.args.get("model"))
        if isinstance(handle, ModelGroup):
            # A slot id names one worker's slot; which of several instances holds a client's
            # cache is not the client's to know, and a save or restore on another one would
            # act on someone else's slot.
            raise Unsupported(
                f"Slot actions act on one worker's slots, and this model runs {len(handle.instances)} "
                "instances (instances in its config): a slot id names no one slot here.",
                "id_slot",
            )
        filename = ""
        base = config.source.parent if config.source is not None else Path.cwd()
        root = folder = resolve_path(config.server.slot_save_path, base)
        if own is not None:
            folder = root / own
        if action != "erase":
            given = data.get("filename")
            if not isinstance(given, str):
                raise InvalidRequest("'filename' is required: the slot file's name.", "filename")
            if not valid_filename(given):
                raise InvalidRequest("Invalid filename", "filename")
            filename = given
        async with handle.lease() as conn:
            slots = conn.ready.slots if conn.ready is not None else 1
            if number < 0:
                raise InvalidRequest("Invalid slot ID", "id_slot")
            slot = number % slots  # llama-server wraps an id past the last slot
            result = await conn.slot_file(
                SlotFile(
                    id=0, slot=slot, action=action, folder=str(folder), filename=filename,
                    folder_max_bytes=config.server.slot_save_max_bytes, cache_scope=cache_scope(key),
                    own_only=own is not None, bound_root=str(root),
                )
            )
        out: dict[str, Any] = {"id_slot": result.slot}
        if action == "erase":
            out["n_erased"] = result.n_tokens
        elif action == "save":
            out.update(filename=filename, n_saved=result.n_tokens, n_written=result.n_bytes,
                       timings={"save_ms": result.ms})
        else:
            out.update(filename=filename, n_restored=result.n_tokens, n_read=result.n_bytes,
                       timings={"restore_ms": result.ms})
        return Response(msgspec.json.encode(out), status=200, content_type="application/json")
