"""Issue 22, item 4: llama-server's slot actions, POST /slots/{id}?action=save|restore|
erase, with the demo model (llama.cpp's server tests, test_slot_save.py,
re-expressed: its test_slot_save_restore and test_slot_erase). A restored slot's prefix is reused
by the next request with that prompt, and the KV invariant holds throughout (no repair)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.e2e.conftest import Server, start_server, stop_server

PROMPT = "What is the capital of France? Answer in one short sentence, please, and nothing more."

CONFIG = """
[server]
port = {PORT}
slot_save_path = "slots"
slots_endpoint = true

[supervisor]
health_interval = 1

[models.gemma]
path = "{MODEL}"
chat_template = "gemma"
slots = 2
n_ctx = 1024
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    tmp = tmp_path_factory.mktemp("slots")
    (tmp / "slots").mkdir()
    srv = start_server(tmp, CONFIG)
    yield srv, tmp / "slots"
    assert stop_server(srv) == 0


def complete(srv: Server, prompt: str = PROMPT) -> dict[str, Any]:
    r = httpx.post(srv.url + "/completion", json={"prompt": prompt, "n_predict": 4, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def act(srv: Server, slot: int | str, action: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"{srv.url}/slots/{slot}?action={action}", json=body if body is not None else {}, timeout=60)


def test_save_erase_restore_round_trip(server: tuple[Server, Path]) -> None:
    srv, folder = server
    first = complete(srv)
    n_prompt = first["timings"]["prompt_n"]
    assert n_prompt > 10
    # Which slot holds it: the one a save finds tokens in.
    saved = [act(srv, s, "save", {"filename": f"slot{s}.bin"}).json() for s in (0, 1)]
    held = max(saved, key=lambda r: r["n_saved"])
    assert held["n_saved"] >= n_prompt and held["n_written"] > 0 and held["timings"]["save_ms"] >= 0
    assert held["filename"] == f"slot{held['id_slot']}.bin" and (folder / held["filename"]).is_file()

    for s in (0, 1):  # both empty: the prompt is decoded in full again
        r = act(srv, s, "erase")
        assert r.status_code == 200 and r.json()["id_slot"] == s
    again = complete(srv)
    assert again["timings"]["prompt_n"] == n_prompt and again["content"] == first["content"]
    for s in (0, 1):
        act(srv, s, "erase")

    other = 1 - held["id_slot"]  # a file is not tied to the slot that wrote it
    r = act(srv, other, "restore", {"filename": held["filename"]})
    assert r.status_code == 200, r.text
    assert r.json()["n_restored"] == held["n_saved"] and r.json()["n_read"] > 0
    reused = complete(srv)
    assert reused["timings"]["prompt_n"] <= 2, reused["timings"]  # served from the restored cells
    assert reused["content"] == first["content"]

    time.sleep(2.5)  # a health ping carries the worker's KV counters
    metrics = httpx.get(srv.url + "/metrics").text
    repairs = [line for line in metrics.splitlines() if line.startswith("corral_model_kv_repairs_total")]
    assert repairs == ['corral_model_kv_repairs_total{model="gemma"} 0.0'], repairs


def test_erase_says_how_many_tokens_it_dropped(server: tuple[Server, Path]) -> None:
    srv, _ = server
    for s in (0, 1):
        act(srv, s, "erase")
    complete(srv, "A different prompt about the sea and the sky and the wind.")
    n = [act(srv, s, "erase").json()["n_erased"] for s in (0, 1)]
    assert max(n) > 5 and min(n) == 0


@pytest.mark.parametrize(
    ("slot", "action", "body", "status", "words"),
    [
        ("x", "save", {"filename": "a.bin"}, 400, "Invalid slot ID"),
        ("-1", "save", {"filename": "a.bin"}, 400, "Invalid slot ID"),
        ("0", "load", {"filename": "a.bin"}, 400, "Invalid action"),
        ("0", "save", {"filename": "../escape.bin"}, 400, "Invalid filename"),
        ("0", "save", {"filename": "sub/dir.bin"}, 400, "Invalid filename"),
        ("0", "save", {}, 400, "filename"),
        ("0", "restore", {"filename": "never-written.bin"}, 400, "Unable to restore slot"),
    ],
)
def test_bad_slot_actions_are_400s_in_llama_servers_words(
    server: tuple[Server, Path], slot: str, action: str, body: dict[str, Any], status: int, words: str
) -> None:
    srv, folder = server
    r = act(srv, slot, action, body)
    assert r.status_code == status and words in r.json()["error"]["message"], r.text
    assert not (folder.parent / "escape.bin").exists()


def test_an_id_past_the_last_slot_wraps_and_garbage_restores_nothing(server: tuple[Server, Path]) -> None:
    srv, folder = server
    assert act(srv, 5, "erase").json()["id_slot"] == 1  # 5 % 2 slots, as llama-server
    (folder / "garbage.bin").write_bytes(b"\x00" * 64)
    r = act(srv, 0, "restore", {"filename": "garbage.bin"})
    assert r.status_code == 400 and "Unable to restore slot" in r.json()["error"]["message"]
    assert act(srv, 0, "erase").json()["n_erased"] == 0  # left empty, and usable
    complete(srv)


def test_without_a_slot_save_path_the_actions_are_501(tmp_path: Path) -> None:
    srv = start_server(tmp_path, CONFIG.replace('slot_save_path = "slots"\n', ""))
    try:
        r = act(srv, 0, "erase")
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    finally:
        assert stop_server(srv) == 0


def test_a_slot_saved_under_other_kv_types_is_refused_not_restored(tmp_path: Path) -> None:
    """A careless operator's order: save slots, switch the model to a q8_0 cache (issue 43),
    restart, restore. llama.cpp's reader refuses the f16 rows (mismatched key type) without
    harm: a 400, and the slot stays empty and usable."""
    (tmp_path / "slots").mkdir()
    srv = start_server(tmp_path, CONFIG)
    try:
        complete(srv)
        saved = [act(srv, s, "save", {"filename": f"slot{s}.bin"}).json() for s in (0, 1)]
        held = max(saved, key=lambda r: r["n_saved"])
        assert held["n_saved"] > 10
    finally:
        assert stop_server(srv) == 0
    quantized = CONFIG + 'cache_type_k = "q8_0"\ncache_type_v = "q8_0"\nflash_attn = "on"\n'
    srv = start_server(tmp_path, quantized)
    try:
        r = act(srv, 0, "restore", {"filename": held["filename"]})
        assert r.status_code == 400 and "Unable to restore slot" in r.json()["error"]["message"], r.text
        assert act(srv, 0, "erase").json()["n_erased"] == 0
        assert complete(srv)["content"]
    finally:
        assert stop_server(srv) == 0
