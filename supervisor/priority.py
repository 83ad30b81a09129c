"""A request's turn in a model's slot line (supervisor/slot_order.py): its key's class, or
the class its `priority` asks for, where the key may choose (issue 44).

`priority` is vLLM's per-request field, on chat and text completions: an integer, lower
served earlier, 0 when left out. vLLM orders by the integer itself; Corral's line has three
classes, and keeps the integer's sign: below 0 is "interactive", 0 "normal", above 0
"batch". A request that leaves it out (or sends null) stands in its key's class.

Only a key with `request_priority = true` (supervisor/config/key_rules.py) may choose.
Another key's request may send a value of its own class, so that a client that always
sends vLLM's default of 0 still works with a "normal" key; any other value is a 400 naming
`priority`, as vLLM refuses a priority while its priority scheduling is off. With no API
key configured every request may choose: one user decides alone what waits.
"""

from __future__ import annotations

from typing import Any

from supervisor.config.keys import Key
from supervisor.errors import InvalidRequest
from supervisor.slot_order import ANONYMOUS, BATCH, INTERACTIVE, NORMAL, Place


def class_of(priority: int) -> int:
    """The class's rank a vLLM `priority` stands for: its sign."""
    return INTERACTIVE if priority < 0 else NORMAL if priority == 0 else BATCH


def requested(key: Key | None, priority: int | None) -> int | None:
    """`priority` as sent, if `key` (the request's; None: no key) may send it. Raises
    InvalidRequest naming `priority`."""
    if priority is None or key is None or key.rules.request_priority or class_of(priority) == key.rules.rank:
        return priority
    raise InvalidRequest(
        f"Got priority {priority}, but this key may not choose its priority: its requests are "
        f"served in the {key.rules.priority!r} class (a key with request_priority = true may choose).",
        "priority",
    )


def relayed(key: Key | None, body: dict[str, Any]) -> None:
    """The same check on a body relayed as it came to an upstream, which may schedule by
    priority itself and knows nothing of this key (router/upstream/routing.py)."""
    value = body.get("priority")
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest("Invalid value for 'priority': expected an integer.", "priority")
    requested(key, value)


def place(key: Key | None, priority: int | None) -> Place:
    """Where a request of `key` stands in the slot line: the class `priority` asks for
    (checked by `requested` when the body was read), else its key's."""
    rank = class_of(priority) if priority is not None else key.rules.rank if key is not None else NORMAL
    return Place(rank, key.owner if key is not None else ANONYMOUS)
