"""A request's JSON body decoded, into a dialect's request type or as any JSON value: the one
place the router decodes a body it was sent.

msgspec decodes and type-checks together and names the offending key path; every failure
is an InvalidRequest that names the parameter, so the client gets a 400 that says exactly
what to fix, in whichever dialect's shape the route answers. Every reader of a request body
(the routes, the upstream hook in router/upstream/routing.py, llama-server's slot actions and
LoRA list) goes through here, because msgspec recurses into nested values, typed or not, and
skips unknown fields by recursion too: a decode anywhere else lets a body nested thousands
deep out as a RecursionError, a 500 (issue 8, finding 2; issue 40, finding 2).
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.server import json_path
from supervisor import msgspec_errors
from supervisor.errors import InvalidRequest


def decode(body: bytes | bytearray, kind: type[msgspec.Struct], api: str = "OpenAI") -> Any:
    """Decode a JSON body into `kind`; InvalidRequest names the offending parameter. `api`
    names the dialect in the hint for a body that is not JSON at all (OpenAI's wording)."""
    if not body or body.isspace():  # strip() would copy a bytearray; isspace() stops early
        raise InvalidRequest("The request body is empty; expected a JSON object.")
    return _bounded(body, kind, api)


def decode_any(body: bytes | bytearray, api: str = "OpenAI") -> Any:
    """Decode a JSON body that is no request type (an array, an object read key by key) into
    Python values; InvalidRequest says what is wrong, as `decode` does. An empty body is not
    JSON: a caller for whom it means "nothing sent" checks for it first."""
    return _bounded(body, Any, api)


def _bounded(body: bytes | bytearray, kind: Any, api: str) -> Any:
    """msgspec's decode, nested no deeper than the interpreter's recursion limit (about
    1,000 levels), with every way it can fail on what a client sent made a 400."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        p = msgspec_errors.problem(exc)
        if p.unknown is not None:
            raise InvalidRequest(f"Unrecognized request argument supplied: {p.key}", p.key) from None
        if p.missing is not None:
            raise InvalidRequest(f"Missing required parameter: '{p.key}'.", p.key) from None
        if not p.path:
            raise InvalidRequest(f"The request body must be a JSON object: {p.message}") from None
        raise InvalidRequest(f"Invalid value for '{p.path}': {p.message}", p.path) from None
    except RecursionError:
        # Free-form fields (tool_choice, an unknown key in a message) are decoded by
        # recursion; a hostile body nested thousands deep must be a 400, not a 500.
        path = json_path.too_deep(body)
        raise InvalidRequest(
            f"Invalid value for '{path}': JSON nested too deeply." if path
            else "The JSON body is nested too deeply.",
            path,
        ) from None
    except UnicodeDecodeError:
        path = json_path.invalid_utf8(body)
        raise InvalidRequest(
            f"Invalid value for '{path}': the string is not valid UTF-8." if path
            else "The request body is not valid UTF-8.",
            path,
        ) from None
    except msgspec.DecodeError:
        raise InvalidRequest(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            f"aren't using your HTTP library correctly. The {api} API expects a JSON payload.)"
        ) from None
