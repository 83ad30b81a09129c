"""Issue 40, findings 1 and 4, on the demo model: what one key sends is not another key's
to read (cached prefixes and their counts) or to steer (slots), unless the operator says
so (`cache_group`, `slot_actions`).

Before: the prefix cache was shared by every key, and answers report `cached_tokens`: a
key guessing another key's prompt ("My bank PIN is 4821 ...") saw 9 cached tokens for a
wrong PIN and 29 of 30 for the right one; any key could save, restore and erase any slot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.e2e.conftest import Server, start_server, stop_server
from tests.secrets import secret

A, B, C, D, ADMIN = (secret(n) for n in ("iso-a", "iso-b", "iso-c", "iso-d", "iso-admin"))

CONFIG = f"""
[server]
port = {{PORT}}
slot_save_path = "slots"
api_keys = ["{A}", "{B}", {{ key = "{C}", cache_group = "team" }}, {{ key = "{D}", cache_group = "team" }}]
admin_keys = ["{ADMIN}"]

[supervisor]
health_interval = 1

[models.gemma]
path = "{{MODEL}}"
chat_template = "gemma"
slots = 2
n_ctx = 1024
"""

SECRET = "My bank PIN is 4821 and my mother's maiden name is Quackenbush. Please remember both of them."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    tmp = tmp_path_factory.mktemp("isolation")
    (tmp / "slots").mkdir()
    srv = start_server(tmp, CONFIG)
    yield srv, tmp
    assert stop_server(srv) == 0


def _h(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def chat(srv: Server, key: str, text: str, **extra: Any) -> int:
    """The cached prompt tokens of a chat with `text`, as the answer reports them."""
    body = {"model": "gemma", "messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0, **extra}
    r = httpx.post(srv.base + "/chat/completions", json=body, headers=_h(key), timeout=120)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def erase_all(srv: Server) -> None:
    for s in (0, 1):
        assert httpx.post(f"{srv.url}/slots/{s}?action=erase", headers=_h(ADMIN), timeout=60).status_code == 200


def test_another_keys_guess_at_a_prompt_learns_nothing_from_cached_tokens(server: tuple[Server, Path]) -> None:
    srv, _ = server
    erase_all(srv)
    chat(srv, A, SECRET)
    assert chat(srv, A, SECRET) > 20  # the owner's own prefix is reused
    # Each guess under a salt of its own, so that B's guesses do not serve each other.
    right = chat(srv, B, SECRET, cache_salt="guess-right")
    wrong = chat(srv, B, SECRET.replace("4821", "1234"), cache_salt="guess-wrong")
    assert right == wrong == 0, (right, wrong)
    assert chat(srv, B, SECRET.replace("4821", "1234"), cache_salt="guess-right") > 5  # B's own, under its salt


def test_keys_of_one_cache_group_share_their_prefixes(server: tuple[Server, Path]) -> None:
    srv, _ = server
    erase_all(srv)
    text = "The team's long shared system prompt, which every member's request begins with, word for word."
    assert chat(srv, C, text) == 0
    assert chat(srv, D, text) > 10  # another key of the group: served from C's cells
    # A key outside it is not: at most the chat template's opening, from A's own earlier turns.
    assert chat(srv, A, text) <= 4


def test_a_cache_salt_splits_one_keys_cache(server: tuple[Server, Path]) -> None:
    srv, _ = server
    erase_all(srv)
    text = "A prompt sent under two different salts by the same key, to keep two users apart."
    assert chat(srv, A, text, cache_salt="user-1") == 0
    assert chat(srv, A, text, cache_salt="user-2") == 0
    assert chat(srv, A, text, cache_salt="user-1") > 10
    r = httpx.post(
        srv.base + "/chat/completions", headers=_h(A), timeout=60,
        json={"model": "gemma", "messages": [{"role": "user", "content": "x"}], "cache_salt": ""},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_slot_actions_are_an_admins_by_default(server: tuple[Server, Path]) -> None:
    srv, tmp = server
    for action, body in (("save", {"filename": "a.bin"}), ("restore", {"filename": "a.bin"}), ("erase", {})):
        r = httpx.post(f"{srv.url}/slots/0?action={action}", json=body, headers=_h(A), timeout=60)
        assert r.status_code == 403 and "admin key" in r.json()["error"]["message"], r.text
    r = httpx.post(f"{srv.url}/slots/0?action=save", json={"filename": "admin.bin"}, headers=_h(ADMIN), timeout=60)
    assert r.status_code == 200 and (tmp / "slots" / "admin.bin").is_file()


def test_with_slot_actions_for_keys_each_key_acts_on_its_own_slots_and_files_only(server: tuple[Server, Path]) -> None:
    srv, tmp = server
    cfg = tmp / "config.toml"
    cfg.write_text(cfg.read_text().replace('slot_save_path = "slots"', 'slot_save_path = "slots"\nslot_actions = "keys"'))
    r = httpx.post(srv.url + "/admin/reload", headers=_h(ADMIN), timeout=60)
    assert r.status_code == 200 and r.json()["needs_restart"] == [], r.text
    try:
        erase_all(srv)
        chat(srv, A, SECRET)

        def act(key: str, slot: int, action: str, name: str = "mine.bin") -> httpx.Response:
            return httpx.post(f"{srv.url}/slots/{slot}?action={action}", json={"filename": name}, headers=_h(key), timeout=60)

        saved = {s: act(A, s, "save") for s in (0, 1)}
        assert all(r.status_code == 200 for r in saved.values()), {s: r.text for s, r in saved.items()}
        held = max(saved.values(), key=lambda r: r.json()["n_saved"]).json()
        assert held["n_saved"] > 20
        own = [p for p in (tmp / "slots").iterdir() if p.is_dir()]
        assert len(own) == 1 and (own[0] / "mine.bin").is_file()  # in A's own folder
        # B: A's slot is not B's to save; its erase erases nothing; A's file is not in B's folder.
        r = act(B, held["id_slot"], "save", "stolen.bin")
        assert r.status_code == 400 and "no cache of this key's" in r.json()["error"]["message"], r.text
        assert act(B, held["id_slot"], "erase").json()["n_erased"] == 0
        r = act(B, held["id_slot"], "restore")
        assert r.status_code == 400 and "Unable to restore slot" in r.json()["error"]["message"], r.text
        assert chat(srv, A, SECRET) > 20  # A's cells survived B's erase
        # A restores its own file into the other slot; B's same prompt still gets nothing from it.
        erase_all(srv)
        assert act(A, 1 - held["id_slot"], "restore").status_code == 200
        assert chat(srv, B, SECRET) == 0
        assert chat(srv, A, SECRET) > 20
    finally:
        cfg.write_text(cfg.read_text().replace('\nslot_actions = "keys"', ""))
        httpx.post(srv.url + "/admin/reload", headers=_h(ADMIN), timeout=60)
