"""Issue 22, item 4: llama-server's /infill end to end (llama.cpp's server tests,
test_infill.py, re-expressed). The demo model has no fill-in-the-middle tokens, so a copy
of it is given some (five unused tokens named as FIM tokens, the header keys that ggml-org's
gguf_new_metadata --special-token-by-id writes; bench/gguf_edit.py writes the copy in a
second where that script took 13 to 24); the plain demo model answers 501, as llama-server
does."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest

from bench.gguf_edit import with_values
from tests.e2e.conftest import DEMO_MODEL, Server, start_server, stop_server

# <unused0> .. <unused4> of the demo model's vocabulary
FIM_IDS = {"fim_pre": 6, "fim_suf": 7, "fim_mid": 8, "fim_rep": 9, "fim_sep": 10}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("infill")
    fim = with_values(DEMO_MODEL, tmp / "demo-fim.gguf", {f"tokenizer.ggml.{name}_token_id": tok for name, tok in FIM_IDS.items()})
    config = f"""
[server]
port = {{PORT}}

[models.fim]
path = "{fim}"
slots = 1
n_ctx = 2048
n_batch = 1024

[models.plain]
path = "{{MODEL}}"
slots = 1
n_ctx = 1024
"""
    srv = start_server(tmp, config)
    yield srv
    assert stop_server(srv) == 0


def count(srv: Server, text: str) -> int:
    r = httpx.post(srv.url + "/tokenize", json={"model": "fim", "content": text, "add_special": False, "parse_special": False})
    return len(r.json()["tokens"])


def infill(srv: Server, **body: Any) -> httpx.Response:
    return httpx.post(srv.url + "/infill", json={"model": "fim", "n_predict": 8, "temperature": 0, **body}, timeout=60)


def test_infill_answers_as_completion_with_the_prompt_laid_out(server: Server) -> None:
    """test_infill_without_input_extra / test_infill_with_input_extra: 200 and
    /completion's answer; the prompt holds what format_prompt_infill lays out, counted."""
    body = {"input_prefix": "#include <cstdio>\n\nint main() {\n", "prompt": "    int n_threads = llama_",
            "input_suffix": "}\n"}
    r = infill(server, **body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out["content"], str) and out["tokens_predicted"] > 0 and out["stop"] is True
    # <REP> myproject\n <SEP> filename\n (this model has both), then BOS <PRE> prefix
    # prompt <SUF> suffix <MID>
    repo = 1 + count(server, "myproject\n") + 1 + count(server, "filename\n")
    expected = repo + 1 + 1 + count(server, body["input_prefix"]) + count(server, body["prompt"]) + 1 + count(server, "}\n") + 1
    assert out["tokens_evaluated"] == expected

    extra = [{"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"}]
    r = infill(server, input_extra=extra, **body)
    assert r.status_code == 200, r.text
    # each file: <SEP> llama.h\n TEXT, between the repo's header and its closing line
    assert r.json()["tokens_evaluated"] == expected + 1 + count(server, "llama.h\n") + count(server, extra[0]["text"])


def test_infill_streams_as_completion_does(server: Server) -> None:
    with httpx.stream("POST", server.url + "/infill", json={
        "model": "fim", "input_prefix": "a = ", "input_suffix": "\n", "n_predict": 4, "stream": True,
    }, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events and events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])


@pytest.mark.parametrize(
    "extra", [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"}, {"filename": 123, "text": 456}]
)
def test_invalid_input_extra_is_a_400(server: Server, extra: dict[str, Any]) -> None:
    """test_infill.py test_invalid_input_extra_req."""
    r = infill(server, input_prefix="a", input_suffix="b", input_extra=[extra])
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_extra"


@pytest.mark.parametrize(("body", "param"), [({"input_suffix": "b"}, "input_prefix"), ({"input_prefix": "a"}, "input_suffix"),
                                             ({"input_prefix": "a", "input_suffix": "b", "prompt": 5}, "prompt"),
                                             ({"input_prefix": "a", "input_suffix": "b", "input_extra": "x"}, "input_extra")])
def test_missing_or_mistyped_fields_are_400s_naming_them(server: Server, body: dict[str, Any], param: str) -> None:
    r = infill(server, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_model_without_fim_tokens_is_501(server: Server) -> None:
    r = httpx.post(server.url + "/infill", json={"model": "plain", "input_prefix": "a", "input_suffix": "b"}, timeout=60)
    assert r.status_code == 501
    assert r.json()["error"]["message"] == (
        "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing. "
    )
