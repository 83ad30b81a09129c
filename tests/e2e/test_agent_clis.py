"""Issue 23's acceptance: the coding agents people point at a local model complete a
one-line prompt against Corral with the demo model and exit 0. Claude Code speaks
Anthropic's Messages API, Codex CLI OpenAI's Responses API; each is installed from npm
(pinned to the release measured, kept in the tests' cache or CORRAL_AGENT_CLIS_DIR) and
run with the set-up the README gives, offline but for Corral.

Claude Code sends its full default request: a system prompt of about 6 kB, 24 tools, a
system message after the user's turn, `thinking`, `context_management` and
`output_config`, about 19,500 tokens in all (its prefill takes a minute or so on two
cores). Codex sends its developer prompt, its function tools, a `namespace` of
sub-agent tools and its hosted `web_search` tool, which Corral leaves out (issue 41, item 6:
the CLIs run with their default configs).

The model ends its answers at their first line (`stop`): a base model never ends a turn by
itself, and both CLIs take an answer cut by max_tokens as a failure, as they should.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.e2e.conftest import ROOT, Server, start_server, stop_server
from tests.harness import registry_cache

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.197"
CODEX = "@openai/codex@0.171.0"
EXAMPLE = ROOT / "examples" / "agents.toml"
KEY = "sk-agents-1"
ADMIN_KEY = "sk-agents-admin"  # for /metrics, which answers an admin key alone once api_keys are set


def _config() -> str:
    """examples/agents.toml as shipped (issue 41, item 2), with a free port, keys, and its
    paths made absolute: the CLIs run against what the README tells a user to serve."""
    text = EXAMPLE.read_text()
    for old, new in (
        ("port = 8080", f'port = {{PORT}}\napi_keys = ["{KEY}"]\nadmin_keys = ["{ADMIN_KEY}"]'),
        ('"../models/gemma-3-270m-Q4_K_M.gguf"', '"{MODEL}"'),
        ('"templates/qwen3.jinja"', f'"{EXAMPLE.parent / "templates" / "qwen3.jinja"}"'),
    ):
        assert text.count(old) == 1, f"examples/agents.toml no longer has {old!r}"
        text = text.replace(old, new)
    return text


CODEX_CONFIG = """
model = "demo"
model_provider = "corral"

[analytics]
enabled = false

[features]
plugins = false           # no plugin lookups on the network

[model_providers.corral]
name = "corral"
base_url = "{BASE}"
env_key = "CORRAL_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""


@pytest.fixture(scope="module")
def clis(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """node_modules/.bin with both CLIs, installed from npm where missing."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (Debian's npm package; `make system-packages` installs it)")
    # The tests' cache (tests/harness.py), a folder for these two pins.
    pins = f"{CLAUDE_CODE}+{CODEX}".replace("@anthropic-ai/", "").replace("@openai/", "").replace("@", "-")
    where = Path(os.environ.get("CORRAL_AGENT_CLIS_DIR") or registry_cache(f"agent-clis/{pins}"))
    where.mkdir(parents=True, exist_ok=True)
    bin_dir = where / "node_modules" / ".bin"
    if not (bin_dir / "claude").exists() or not (bin_dir / "codex").exists():
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(where), CLAUDE_CODE, CODEX],
            capture_output=True, text=True, timeout=900,
        )
        if done.returncode != 0:
            pytest.skip(f"npm could not install {CLAUDE_CODE} and {CODEX}: {done.stderr[-2000:]}")
    return bin_dir


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("agents"), _config())
    yield srv
    assert stop_server(srv) == 0


def _requests(server: Server, endpoint: str) -> float:
    """corral_requests_total of `endpoint` answered 200."""
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("corral_requests_total{") and f'endpoint="{endpoint}"' in line and 'status="200"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _env(home: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TMPDIR")}
    return {**keep, "HOME": str(home), **extra}


def test_claude_code_completes_a_prompt_against_corral(clis: Path, server: Server, tmp_path: Path) -> None:
    env = _env(
        tmp_path,
        ANTHROPIC_BASE_URL=server.url,
        ANTHROPIC_AUTH_TOKEN=KEY,
        ANTHROPIC_MODEL="demo",
        ANTHROPIC_SMALL_FAST_MODEL="demo",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_MAX_RETRIES="0",  # a server error fails the run at once
    )
    before = _requests(server, "/v1/messages")
    done = subprocess.run(
        [str(clis / "claude"), "-p", "Say ok.", "--output-format", "json"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["is_error"] is False and result["subtype"] == "success" and result["stop_reason"] == "end_turn"
    assert result["usage"]["input_tokens"] + result["usage"]["cache_read_input_tokens"] > 10_000  # its whole prompt
    assert _requests(server, "/v1/messages") > before


def test_codex_completes_a_prompt_against_corral(clis: Path, server: Server, tmp_path: Path) -> None:
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(CODEX_CONFIG.replace("{BASE}", server.base))
    env = _env(tmp_path, CODEX_HOME=str(codex_home), CORRAL_API_KEY=KEY)
    before = _requests(server, "/v1/responses")
    done = subprocess.run(
        # stdin closed: with a pipe open, codex exec waits for more prompt on it
        [str(clis / "codex"), "exec", "--skip-git-repo-check", "Say ok."],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    # Codex prints the answer alone on stdout; an answer it could not read leaves it empty.
    assert done.stdout.strip(), done.stderr[-3000:]
    assert _requests(server, "/v1/responses") > before
    # Its hosted web_search was left out, and the log says so.
    assert "Responses tool type 'web_search' is not served by Corral" in server.log_text()
