"""The shapes a completion's `prompt` and an embedding's `input` may take, as OpenAI
accepts them: a string, a list of strings, a token array, or a list of token arrays.

msgspec unions allow one list type, so the request types declare `list[Any]` and the
elements are checked here; every failure is a 400 naming the parameter. Token ids are only
range-checked here (the router has no vocabulary); the worker checks them against its own.
"""

from __future__ import annotations

from typing import Any, Union

from supervisor.errors import InvalidRequest

# One prompt: its text, or its token ids.
Prompt = Union[str, tuple[int, ...]]

MAX_PROMPTS = 128  # prompts in one completion request, as many as OpenAI's n allows choices
_TOKEN_MAX = 2**31 - 1  # llama_token is int32


def _is_token(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _tokens(xs: list[Any], param: str) -> tuple[int, ...]:
    if not xs:
        raise InvalidRequest(f"Invalid value for '{param}': a token array must not be empty.", param)
    for x in xs:
        if not _is_token(x) or not 0 <= x <= _TOKEN_MAX:
            raise InvalidRequest(
                f"Invalid value for '{param}': expected token ids (integers from 0 to {_TOKEN_MAX}), got {x!r}.",
                param,
            )
    return tuple(xs)


def prompt_list(value: str | list[Any], param: str) -> list[Prompt]:
    """The prompts of `value`, one per list entry (a flat list of ints is one prompt)."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise InvalidRequest(f"Invalid value for '{param}': must not be an empty array.", param)
    if all(_is_token(x) for x in value):
        return [_tokens(value, param)]
    if len(value) > MAX_PROMPTS:
        raise InvalidRequest(f"Invalid value for '{param}': at most {MAX_PROMPTS} entries are allowed.", param)
    out: list[Prompt] = []
    for i, x in enumerate(value):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, list):
            out.append(_tokens(x, f"{param}[{i}]"))
        else:
            raise InvalidRequest(
                f"Invalid type for '{param}[{i}]': expected a string or an array of token ids.", f"{param}[{i}]"
            )
    return out
