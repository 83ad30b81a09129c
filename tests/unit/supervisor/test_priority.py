"""supervisor/priority.py: vLLM's `priority` onto the slot line's classes, and which key may
send it (issue 44)."""

from __future__ import annotations

import pytest

from supervisor import priority
from supervisor.config.key_rules import KeyRules
from supervisor.config.keys import Key, digest
from supervisor.errors import InvalidRequest
from supervisor.slot_order import ANONYMOUS, BATCH, INTERACTIVE, NORMAL, Place

BATCH_KEY = Key("jobs", digest("jobs"), rules=KeyRules(priority="batch"))
CHOOSER = Key("app", digest("app"), rules=KeyRules(request_priority=True))


def test_the_sign_of_priority_picks_the_class() -> None:
    assert [priority.class_of(p) for p in (-100, -1, 0, 1, 7)] == [INTERACTIVE, INTERACTIVE, NORMAL, BATCH, BATCH]


def test_a_key_that_may_choose_gets_the_class_it_asks_for() -> None:
    assert priority.requested(CHOOSER, -5) == -5
    assert priority.place(CHOOSER, -5) == Place(INTERACTIVE, CHOOSER.owner)
    assert priority.place(CHOOSER, None) == Place(NORMAL, CHOOSER.owner)  # left out: its key's


def test_another_key_may_send_only_its_own_class() -> None:
    assert priority.requested(BATCH_KEY, None) is None and priority.requested(BATCH_KEY, 3) == 3
    for asked in (0, -1):
        with pytest.raises(InvalidRequest) as exc:
            priority.requested(BATCH_KEY, asked)
        assert exc.value.param == "priority" and "'batch' class" in exc.value.message
    assert priority.place(BATCH_KEY, None) == Place(BATCH, BATCH_KEY.owner)


def test_without_keys_every_request_may_choose() -> None:
    assert priority.requested(None, -1) == -1
    assert priority.place(None, -1) == Place(INTERACTIVE, ANONYMOUS) and priority.place(None, None) == Place()


def test_a_relayed_body_is_checked_the_same_way() -> None:
    priority.relayed(BATCH_KEY, {"model": "m"})
    priority.relayed(BATCH_KEY, {"priority": 9})
    for bad in ({"priority": -1}, {"priority": "high"}, {"priority": True}, {"priority": 1.5}):
        with pytest.raises(InvalidRequest) as exc:
            priority.relayed(BATCH_KEY, bad)
        assert exc.value.param == "priority"
