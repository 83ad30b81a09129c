"""JSON that Corral did not write and that no client sent as a request body: a model's
output read for tool calls and structured answers, an upstream server's answer (its events,
its error bodies, its embeddings, its token counts, a fleet server's /admin/models), a
client's call arguments carried as text, and, in the command line, a server's answers. The
counterpart of json_body.py, which decodes what a client sent and makes every failure a 400.

Python's json (like msgspec) decodes by recursion, so text nested deeper than the
interpreter's recursion limit (about 1,000 levels) raises RecursionError, not ValueError.
Every reader of such text catches ValueError and treats it as text that is not JSON: a
call's arguments that do not parse, an upstream answer that is broken (a 502). A model
asked to copy a call nested 5,000 `[` deep, or an upstream that answers anything, must get
that same treatment rather than a 500, a broken stream or a crashed task, so they all decode
through `loads`, which turns the RecursionError into the ValueError they handle, or, for a
large answer of a known shape, `decode_as`. In router.server, which every other part of the
router and the command line may import.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def loads(text: str | bytes | bytearray) -> Any:
    """`json.loads(text)`: the same values, and the same ValueError (JSONDecodeError) for
    text that is not JSON; JSON nested too deep to decode is a ValueError too."""
    try:
        return json.loads(text)
    except RecursionError:
        # Caught where the decoder gave up, so the stack has unwound: nothing else is short
        # of room. `from None`: the recursion's traceback says nothing a reader can use.
        raise ValueError("JSON nested too deeply to decode") from None


def decode_as(text: bytes, kind: type[T]) -> T:
    """`text` decoded straight into `kind` (msgspec's typed decode: a 170 MB embeddings
    answer in under a second where loads and a walk over it take seven, each holding the
    GIL). Raises ValueError for text that is not JSON or is nested too deeply (its message
    says "not JSON"), and msgspec.ValidationError, a ValueError too, for JSON that is not a
    `kind`."""
    try:
        return msgspec.json.decode(text, type=kind)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    except RecursionError:
        raise ValueError("not JSON: nested too deeply to decode") from None
