"""What a key may take of a shared server: its quotas and its place in the slot line.

Set on a key's table in `[server] api_keys` (or as `attr=value` on its line of
`api_keys_file`), read again at every reload:

- `requests_per_minute`, `tokens_per_minute`: over the last 60 seconds (tokens: prompt and
  generated, as OpenAI counts them against a TPM limit);
- `tokens_per_day`: since 00:00 UTC, counted from the usage ledger, so a restart does not
  reset it;
- `max_in_flight`: requests of the key being answered at once;
- `priority`: its class in every model's slot line, "interactive" ahead of "normal" ahead
  of "batch";
- `request_priority`: whether its requests may set vLLM's `priority` field.

None is no limit.
"""

from __future__ import annotations

from typing import Iterator, Literal

import msgspec

Priority = Literal["interactive", "normal", "batch"]
# A class's rank in the slot line: lower is served first (vLLM's order for `priority`).
RANKS: dict[str, int] = {"interactive": 0, "normal": 1, "batch": 2}

QUOTAS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "max_in_flight")
FIELDS = (*QUOTAS, "priority", "request_priority")


class KeyRules(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    max_in_flight: int | None = None
    priority: Priority = "normal"
    request_priority: bool = False

    @property
    def rank(self) -> int:
        return RANKS[self.priority]

    @property
    def limited(self) -> bool:
        """Whether any quota applies (and its requests carry rate-limit headers)."""
        return any(getattr(self, q) is not None for q in QUOTAS)


NONE = KeyRules()


def from_fields(fields: dict[str, str | int | bool | None]) -> KeyRules:
    """The rules among `fields` (a key table's, or a keys file line's strings); raises
    msgspec.ValidationError naming the field."""
    given = {k: v for k, v in fields.items() if k in FIELDS and v is not None}
    return msgspec.convert(given, KeyRules, strict=False) if given else NONE


def problems(rules: KeyRules, where: str) -> Iterator[str]:
    for q in QUOTAS:
        value = getattr(rules, q)
        if value is not None and value < 1:
            yield f"{where}.{q}: must be at least 1 (leave it out for no limit), got {value}"
