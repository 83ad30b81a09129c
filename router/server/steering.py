"""What an ordinary key may steer, and see, of a server that many keys share (issue 40).

With no key configured at all, the server has one user, who may do everything. Once keys
are configured, a model's lifetime is the operator's: any key that may use a model loads it
on demand, but only an admin key unloads it (llama-server's `POST /models/unload`, Ollama's
`keep_alive: 0` with nothing to answer) or keeps it loaded past the config's bound (Ollama's
`keep_alive`); and a running request's parameters (its stop strings, seed, token limit, in
`GET /slots`) are shown to the key that sent it and to admin keys only.

Pure decisions over the keyring and the key a request acts with; the routes do the I/O.
"""

from __future__ import annotations

import math

from supervisor.config.keys import Key, Keyring
from supervisor.errors import Forbidden


def may_steer(ring: Keyring, key: Key | None) -> bool:
    """Whether a request may unload models and set their lifetimes freely: on a server
    with no key configured (one user), or with an admin key."""
    return not ring.keys or (key is not None and key.admin)


def refuse_unless_steering(ring: Keyring, key: Key | None, what: str, param: str | None = None) -> None:
    """Raise Forbidden (403) naming `what` unless the request may steer (may_steer)."""
    if not may_steer(ring, key):
        raise Forbidden(f"{what} needs an admin key on this server: loading stays open to every key.", param)


def bounded_keep_alive(asked: float | None, idle_timeout: float, most: float | None) -> float | None:
    """An ordinary key's keep_alive (seconds; < 0 for ever; None: the config's idle_timeout
    again), as it may set it: never shorter than the model's `idle_timeout` (0: it never
    idles out), so that it cannot unload a model the next key then loads again, and never
    longer than `most`, the config's `[server] max_keep_alive` (None: the idle_timeout;
    0: no bound), so that it cannot hold memory the operator meant for other models.
    Returns the same kind of value: -1.0 for ever."""
    if asked is None:
        return None  # the config's own lifetime, which is within bounds by definition
    floor = math.inf if idle_timeout <= 0 else idle_timeout
    ceiling = floor if most is None else math.inf if most <= 0 else most
    wanted = math.inf if asked < 0 else asked
    kept = min(max(wanted, floor), max(ceiling, floor))
    return -1.0 if math.isinf(kept) else kept


def shows_request(ring: Keyring, viewer: Key | None, owner: str | None) -> bool:
    """Whether `viewer` may see a running request's parameters, `owner` being the digest
    (Key.owner) of the key that sent it (None: no key, or not known). With no key
    configured, every request is the one user's; an admin key sees everything; any other
    key sees only its own."""
    if may_steer(ring, viewer):
        return True
    return viewer is not None and owner is not None and owner == viewer.owner
