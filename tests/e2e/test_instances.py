"""`instances = 2` with the real demo model (issue 43, item 3): two single-thread workers
of one model, served as one name. Both take work under a concurrent load, and each turn of
a conversation finds its earlier turns' prefix cached on the instance it returns to."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import openai

from tests.e2e.conftest import pooled_briefly, start_server, stop_server

TWO_INSTANCES = """
[server]
port = {PORT}

[models.m]
path = "{MODEL}"
instances = 2
threads = 1
slots = 1
n_ctx = 1024
chat_template = "gemma"
preload = true
"""


def test_two_instances_share_a_load_and_a_conversation_keeps_its_prefix(tmp_path: Path) -> None:
    srv = start_server(tmp_path, TWO_INSTANCES)
    try:
        client = openai.OpenAI(base_url=srv.base, api_key="none", max_retries=0, http_client=pooled_briefly())
        models = [m.id for m in client.models.list().data]
        assert models == ["m"]

        def ask(i: int) -> str:
            r = client.completions.create(model="m", prompt=f"Count to {i}:", max_tokens=16, temperature=0)
            return r.choices[0].text

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert len(list(pool.map(ask, range(4)))) == 4
        assert sorted(srv.workers()) == ["m", "m#1"]  # two processes, one each

        system = {"role": "system", "content": "You are a helpful assistant. " * 20}
        messages = [system, {"role": "user", "content": "Name a colour."}]
        cached: list[int] = []
        for turn in range(3):
            r = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
            details = r.usage.prompt_tokens_details if r.usage is not None else None
            cached.append(details.cached_tokens or 0 if details is not None else 0)
            messages += [
                {"role": "assistant", "content": r.choices[0].message.content or ""},
                {"role": "user", "content": f"And another one, number {turn + 2}?"},
            ]
        # Every later turn found the earlier turns' prompt on its instance.
        assert cached[1] > 100 and cached[2] > cached[1], cached
    finally:
        assert stop_server(srv) == 0
