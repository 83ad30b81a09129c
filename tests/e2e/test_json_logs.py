"""`log_format = "json"`: every line `corral serve` and its real worker write is one JSON
object; an access line carries the request's fields, and the worker's lines the model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.e2e.conftest import start_server, stop_server
from tests.secrets import secret

KEY = secret("json-logs")

CONFIG = """
[server]
port = {PORT}
log_format = "json"
api_keys = [{ key = "KEY", name = "ops" }]

[models.chat]
path = "{MODEL}"
slots = 2
n_ctx = 1024
chat_template = "gemma"
"""


def test_every_line_is_one_json_object(tmp_path: Path) -> None:
    srv = start_server(tmp_path, CONFIG.replace("KEY", KEY))
    try:
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            headers={"authorization": f"Bearer {KEY}", "x-request-id": "json-1"},
            timeout=120,
        )
        assert r.status_code == 200 and r.headers["x-request-id"] == "json-1"
    finally:
        assert stop_server(srv) == 0
    text = srv.log_text()
    records = [json.loads(line) for line in text.splitlines() if line.strip()]  # each parses alone
    assert len(records) >= 4
    access = [o for o in records if o["logger"] == "corral.access"]
    assert {o["endpoint"] for o in access} == {"/health", "/v1/chat/completions"}  # start_server polls /health
    (a,) = [o for o in access if o["endpoint"] == "/v1/chat/completions"]
    assert (a["request_id"], a["key"], a["model"], a["status"]) == ("json-1", "ops", "chat", 200)
    assert a["generated_tokens"] == r.json()["usage"]["completion_tokens"] and a["ttft"] > 0
    worker = [o for o in records if o.get("model") == "chat" and o["logger"].startswith("worker")]
    assert any("ready" in o["message"] for o in worker), records
    assert KEY not in text
