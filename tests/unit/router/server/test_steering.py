"""What an ordinary key may steer and see (issue 40, finding 5): the pure rules of
router/server/steering.py and the output cap of router/generation/sampling.py."""

from __future__ import annotations

import pytest

from router.generation.sampling import capped
from router.server.steering import bounded_keep_alive, may_steer, refuse_unless_steering, shows_request
from supervisor.config import keys
from supervisor.config.keys import Key, Keyring, KeySource
from supervisor.errors import Forbidden
from tests.secrets import secret
from worker.protocol import SamplingParams


def _ring() -> tuple[Keyring, Key, Key, Key]:
    ring, bad = keys.keyring(
        [
            KeySource("server.api_keys[0]", secret("alice"), "alice", None),
            KeySource("server.api_keys[1]", secret("bob"), "bob", None),
            KeySource("server.admin_keys[0]", secret("ops"), None, None, admin=True),
        ],
        {},
    )
    assert bad == []
    alice, bob, ops = ring.keys
    return ring, alice, bob, ops


def test_only_an_admin_key_steers_once_keys_are_configured() -> None:
    ring, alice, _, ops = _ring()
    assert not may_steer(ring, alice) and not may_steer(ring, None)
    assert may_steer(ring, ops)
    # No key at all: the server has one user, who does everything as before.
    assert may_steer(Keyring(), None)
    with pytest.raises(Forbidden) as refused:
        refuse_unless_steering(ring, alice, "POST /models/unload")
    assert "admin key" in refused.value.message and "POST /models/unload" in refused.value.message
    refuse_unless_steering(ring, ops, "POST /models/unload")
    refuse_unless_steering(Keyring(), None, "POST /models/unload")


@pytest.mark.parametrize(
    ("asked", "idle_timeout", "most", "kept"),
    [
        (None, 600, None, None),  # the config's own lifetime: always allowed
        (-1, 600, None, 600),  # for ever: cut to the idle_timeout (the default bound)
        (0, 600, None, 600),  # unload once done: not earlier than the idle_timeout
        (10, 600, None, 600),
        (3600, 600, None, 600),
        (-1, 600, 1800, 1800),  # [server] max_keep_alive raises the bound
        (900, 600, 1800, 900),
        (10, 600, 1800, 600),
        (-1, 600, 0, -1),  # max_keep_alive = 0: no bound, for ever allowed
        (5, 0, None, -1),  # idle_timeout 0 (never idles out): nothing unloads it sooner
        (-1, 600, 60, 600),  # a bound below the idle_timeout does not shorten it
    ],
)
def test_an_api_keys_keep_alive_neither_unloads_early_nor_pins(
    asked: float | None, idle_timeout: float, most: float | None, kept: float | None
) -> None:
    assert bounded_keep_alive(asked, idle_timeout, most) == kept


def test_another_keys_running_request_is_shown_to_its_key_and_admins_only() -> None:
    ring, alice, bob, ops = _ring()
    assert shows_request(ring, alice, alice.owner)
    assert not shows_request(ring, bob, alice.owner)
    assert not shows_request(ring, None, alice.owner)
    assert shows_request(ring, ops, alice.owner)
    # A request whose sender is not known (just ended, or keyless) is an admin's to see.
    assert not shows_request(ring, alice, None)
    assert shows_request(ring, ops, None)
    assert shows_request(Keyring(), None, None)


@pytest.mark.parametrize(
    ("asked", "caps", "limit"),
    [
        (32000, (4096, None), 4096),  # Claude Code's default, on a model capped at 4096
        (None, (4096, None), 4096),  # no limit asked: the cap, as llama-server's -n
        (100, (4096, None), 100),
        (32000, (4096, 512), 512),  # the lower of the model's and the key's
        (None, (None, 512), 512),
        (0, (4096, 512), 0),  # /completion's n_predict 0 (prefill only) is below any cap
        (32000, (None, None), 32000),
        (None, (None, None), None),
    ],
)
def test_output_is_cut_to_the_lower_of_the_models_and_the_keys_cap(
    asked: int | None, caps: tuple[int | None, int | None], limit: int | None
) -> None:
    p = SamplingParams(max_tokens=asked, temperature=0.3, stop=["x"])
    got = capped(p, *caps)
    assert got.max_tokens == limit
    assert (got.temperature, got.stop) == (0.3, ["x"])
