"""The shapes a completion's `prompt` and an embedding's `input` may take: OpenAI's (a
string, a list of strings, a token array, a list of token arrays) and llama-server's
(tools/server/server-common.cpp, tokenize_input_prompts and tokenize_input_subprompt): a
prompt may also mix token ids and strings (`[12, 34, "text", 56]`, the strings tokenized
in place), be an object `{"prompt_string": ...}`, or, for embeddings, `{"content":
[{"type": "text", "text": ...}, ...]}`; a list of prompts may mix all of these.

msgspec unions allow one list type, so the request types declare `list[Any]` and the
elements are checked here; every failure is a 400 naming the parameter. Token ids are only
range-checked here (the router has no vocabulary); the worker checks them against its own.
"""

from __future__ import annotations

from typing import Any, Union

from supervisor.errors import InvalidRequest

# One prompt: its text, or its token ids, or token ids and texts mixed.
Prompt = Union[str, tuple[Union[int, str], ...]]

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


def is_tokens(p: Prompt) -> bool:
    """A prompt of token ids alone."""
    return isinstance(p, tuple) and all(_is_token(x) for x in p)


def prompt_list(value: str | list[Any] | dict[str, Any], param: str) -> list[Prompt]:
    """The prompts of `value`: a list holding any token id is one prompt (llama-server's
    json_is_array_and_contains_numbers); any other list is one prompt per entry."""
    if isinstance(value, list) and not value:
        raise InvalidRequest(f"Invalid value for '{param}': must not be an empty array.", param)
    if not isinstance(value, list) or any(_is_token(x) for x in value):
        return [_one(value, param)]
    if len(value) > MAX_PROMPTS:
        raise InvalidRequest(f"Invalid value for '{param}': at most {MAX_PROMPTS} entries are allowed.", param)
    return [_one(x, f"{param}[{i}]") for i, x in enumerate(value)]


def _one(x: object, param: str) -> Prompt:
    """One prompt: a string, token ids (with strings among them or not), or an object."""
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        if any(isinstance(e, str) for e in x) and all(isinstance(e, str) or _is_token(e) for e in x):
            for e in x:
                if _is_token(e):
                    _tokens([e], param)  # its range
            return tuple(x)
        return _tokens(x, param)
    if isinstance(x, dict):
        if "prompt_string" in x:
            if "multimodal_data" in x:
                raise InvalidRequest(
                    f"Invalid value for '{param}': multimodal_data is taken in a request's one prompt object, "
                    "not in a list of prompts or an embedding.",
                    param,
                )
            inner = x["prompt_string"]
            if isinstance(inner, (str, list)):
                return _one(inner, f"{param}.prompt_string")
        elif "content" in x:
            return _content_text(x["content"], f"{param}.content")
    raise InvalidRequest(
        f"Invalid type for '{param}': expected a string, token ids (with strings among them), "
        '{"prompt_string": ...} or {"content": [text parts]}.',
        param,
    )


def _content_text(parts: object, param: str) -> str:
    """OpenAI content parts as one text, the parts joined as they are. A bare string is
    refused, as llama-server refuses it (test_embedding.py test_embedding_invalid_input)."""
    if not isinstance(parts, list):
        raise InvalidRequest(f"Invalid value for '{param}': expected an array of content parts.", param)
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"Invalid value for '{param}[{i}]': only text parts can be embedded here.", f"{param}[{i}]")
        texts.append(part["text"])
    return "".join(texts)
