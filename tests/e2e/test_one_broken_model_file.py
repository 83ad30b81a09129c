"""A server with one good and one missing model file serves the good one (issue 20, item 4),
with the real worker and the demo model. On 8ad3c96 `corral serve` exited at once:
"models.gone.path: no such file: ..."."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from tests.e2e.conftest import DEMO_MODEL, start_server, stop_server

CONFIG = """
[server]
port = {PORT}

[models.good]
path = "{MODEL}"
slots = 1
n_ctx = 512
chat_template = "gemma"

[models.gone]
path = "{GONE}"
slots = 1
n_ctx = 512
chat_template = "gemma"
"""


def test_one_missing_model_file_leaves_the_other_model_served(tmp_path: Path) -> None:
    gone = tmp_path / "downloads" / "gone.gguf"
    srv = start_server(tmp_path, CONFIG.replace("{GONE}", str(gone)))
    try:
        chat = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0}
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "good", **chat}, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text

        entry = httpx.get(srv.url + "/v1/models/gone", timeout=10).json()
        assert entry["state"] == "failed" and "no such file" in entry["last_error"]
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "gone", **chat}, timeout=30)
        assert r.status_code == 503 and r.headers["x-should-retry"] == "false"
        assert "no such file" in r.json()["error"]["message"]

        # The download lands; a reset serves it with a real worker.
        gone.parent.mkdir()
        shutil.copy(DEMO_MODEL, gone)
        assert httpx.post(srv.url + "/admin/models/gone/reset", timeout=10).json()["reset"] is True
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "gone", **chat}, timeout=120)
        assert r.status_code == 200, r.text
    finally:
        assert stop_server(srv) == 0

