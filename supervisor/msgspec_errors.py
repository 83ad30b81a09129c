"""msgspec's validation errors, taken apart: what went wrong, and where.

msgspec reports "Expected `int`, got `str` - at `$.messages[0].role`". The router turns that
into an OpenAI error naming the parameter, and the config loader into a config problem
naming the key. Both read it here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

_LOCATED = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]+)`")
_MISSING = re.compile(r"^Object missing required field `(?P<key>[^`]+)`")


@dataclass(frozen=True)
class Problem:
    message: str  # msgspec's words, without the location
    path: str  # where: "messages[0].role"; "" for the top level
    unknown: str | None = None  # the key that is not allowed there, if that is the problem
    missing: str | None = None  # the required key that is absent, if that is the problem

    @property
    def key(self) -> str:
        """The path down to the offending key itself (an unknown or missing one included)."""
        name = self.unknown or self.missing
        if name is None:
            return self.path
        return f"{self.path}.{name}" if self.path else name


def problem(exc: msgspec.ValidationError) -> Problem:
    m = _LOCATED.match(str(exc))
    assert m is not None  # the pattern matches any string
    msg, path = m.group("msg"), (m.group("path") or "").lstrip(".")
    unknown, missing = _UNKNOWN.match(msg), _MISSING.match(msg)
    return Problem(
        message=msg,
        path=path,
        unknown=unknown.group("key") if unknown else None,
        missing=missing.group("key") if missing else None,
    )
