"""Every JSON decode in the router and the command line, read from the source: what a client
sent goes through router/server/json_body.py (a 400 naming the parameter), what a model
wrote or another server answered through router/server/json_text.py (nesting too deep is the
ValueError its readers take for "not JSON"). Python's json and msgspec decode by recursion,
so a decode anywhere else lets text nested thousands deep out as a RecursionError: a 500, a
broken stream, a traceback (issue 40, finding 2; and test_deep_json_output.py,
test_deep_json_upstreams.py for the readers of models' and upstreams' JSON).

The few decodes left read JSON that Corral encoded itself a moment before, from a value it
had already decoded through one of the two: each is listed here with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
# (file, the decodes it holds): the two decoders, and JSON of Corral's own making.
OWN: dict[str, int] = {
    "router/server/json_body.py": 1,  # the decoder of request bodies
    "router/server/json_text.py": 2,  # the decoders of models' and upstreams' JSON
    "router/api/openai/errors.py": 1,  # the error envelope it has just encoded
    "router/api/openai/routes.py": 1,  # its own whole answer, to add llama-server's __verbose
    # A JSON schema the router encoded from the client's, decoded by json_body.py.
    "router/generation/remote/outbound.py": 1,
    "router/generation/remote/anthropic_request.py": 1,
}


def _decodes(path: Path) -> int:
    """Calls of json.loads / json.load and uses of msgspec.json.decode / Decoder."""
    n = 0
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id == "json" and node.attr in ("loads", "load"):
            n += 1
        elif (isinstance(owner, ast.Attribute) and owner.attr == "json" and node.attr in ("decode", "Decoder")
              and isinstance(owner.value, ast.Name) and owner.value.id == "msgspec"):
            n += 1
    return n


def test_json_is_decoded_only_through_the_two_bounded_decoders() -> None:
    found = {
        str(p.relative_to(ROOT)): n
        for package in ("router", "corral")
        for p in sorted((ROOT / package).rglob("*.py"))
        if (n := _decodes(p))
    }
    assert found == OWN
