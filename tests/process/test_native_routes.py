"""llama-server's routes against the process fake worker (tests/fake_worker.py): every new
frame crosses a real socket and a real process, busy slots included."""

from __future__ import annotations

from pathlib import Path

import trio

from router.app import create_app
from tests.process.support import StartLog, make_supervisor, running


async def test_native_frames_cross_the_process_fake(tmp_path: Path, start_log: StartLog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    sup = make_supervisor(tmp_path, {"a": {"slots": 2, "n_ctx": 64}})
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup), trio.open_nursery() as nursery:
            r = await client.post("/tokenize", json={"model": "a", "content": "x y", "with_pieces": True, "add_special": True})
            assert [t["piece"] for t in (await r.get_json())["tokens"]] == ["<bos>", "x", "y"]
            r = await client.post("/detokenize", json={"model": "a", "tokens": [5, 32000]})
            assert r.status_code == 400 and (await r.get_json())["error"]["param"] == "tokens"
            r = await client.post("/apply-template", json={"model": "a", "messages": [{"role": "user", "content": "q"}]})
            assert (await r.get_json())["prompt"] == "<user>q\n<assistant>"

            r = await client.post("/completion", json={"model": "a", "prompt": "w " * 70})
            err = (await r.get_json())["error"]
            assert err["type"] == "exceed_context_size_error" and (err["n_prompt_tokens"], err["n_ctx"]) == (71, 64)

            r = await client.post("/completion", json={"model": "a", "prompt": "go", "n_predict": 9, "stop": ["tok3"]})
            out = await r.get_json()
            assert (out["content"], out["stop_type"], out["stopping_word"]) == ("tok0 tok1 tok2 ", "word", "tok3")

            async def busy() -> None:
                await client.post("/completion", json={"model": "a", "prompt": "go", "n_predict": 40})

            nursery.start_soon(busy)
            for _ in range(100):
                slots = await (await client.get("/slots?model=a")).get_json()
                if any(s["is_processing"] for s in slots):
                    break
                await trio.sleep(0.05)
            assert len(slots) == 2 and [s["is_processing"] for s in slots] == [True, False]
            assert slots[0]["next_token"]["n_decoded"] >= 0
            nursery.cancel_scope.cancel()
