"""Tools that run at the API's provider, which Corral cannot run: the Responses API's hosted
tools (`web_search`, `file_search`, `code_interpreter`, `image_generation`, `mcp`, ...) and
Anthropic's server and Anthropic-defined tools (a versioned `type`: `web_search_20250305`,
`bash_20250124`, ...).

Agent CLIs send them by default (Codex CLI its `web_search`), so refusing the request means
the CLI's first prompt fails until its user edits its config. As llama-server does since
ggml-org/llama.cpp PR #23041 (its users hit that wall, issue #20156), Corral by default
leaves them out and serves the rest: the model is offered the function tools alone. What was
left out is said once in the log per tool type, and on every such answer in a header
(`x-corral-skipped-tools`), and a Responses answer's `tools` echoes only the tools served.
`[server] hosted_tools = "refuse"` keeps the strict 400 naming the tool.
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Literal, Sequence, TypeVar

from quart import Response

log = logging.getLogger("corral.router")

Policy = Literal["skip", "refuse"]
T = TypeVar("T")

HEADER = "x-corral-skipped-tools"

# A type is the client's string: the header and the log show a safe, short form of it, and
# what has been said is remembered for at most _REMEMBERED types (then nothing more is said:
# a client sending ever new types must not flood the log or grow this set).
_said: set[tuple[str, str]] = set()
_REMEMBERED = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def _shown(kind: str) -> str:
    return _UNSAFE.sub("?", kind[:40])


def note(api: str, kinds: Sequence[str], response: Response) -> Response:
    """Say which tool types `api`'s request had left out: in the log, once per type for the
    life of the process (an agent sends the same tools every turn), and in `response`'s
    header, every time (its first 16 types)."""
    if not kinds:
        return response
    shown = list(dict.fromkeys(_shown(k) for k in kinds))
    for kind in shown:
        if (api, kind) not in _said and len(_said) < _REMEMBERED:
            _said.add((api, kind))
            log.warning(
                "%s tool type %r is not served by Corral (it runs at the API's provider): left out, "
                "the request's other tools are served; said once per type. "
                '[server] hosted_tools = "refuse" answers such requests 400 instead',
                api, kind,
            )
    response.headers[HEADER] = ", ".join(shown[:16]) + (", ..." if len(shown) > 16 else "")
    return response


def served(policy: Policy, tools: T, split: Callable[[T], tuple[T, list[str]]]) -> tuple[T, list[str]]:
    """`tools` with what runs at the provider taken out by `split` (the dialect's), and the
    types taken out; under "refuse", as they came, for the dialect's check to refuse."""
    return (tools, []) if policy == "refuse" else split(tools)
