"""Whose cached prompt prefixes a request may reuse: its cache scope.

A worker reuses the KV cells of any earlier prompt that shares a prefix with a new one
(worker/prefix_reuse.py), and answers say how many prompt tokens came from the cache
(`cached_tokens`, Anthropic's `cache_read_input_tokens`, llama-server's `tokens_cached`), as
does the time the prompt took. Shared between keys, that is an oracle: a key that guesses
another key's prompt ("My bank PIN is 4821 ...") sees from the count, token by token,
whether it guessed right. So cells belong to a scope, and a request reuses only its own
scope's (the worker compares scopes before prefixes, worker/slots.py `scoped`):

- with no key configured, every request is in one scope: one user, or users who trust
  each other, share everything, as llama-server's users do;
- a key's requests are in the key's own scope, unless the key names a `cache_group`:
  keys of one group share one scope (an application that holds a key per user, all with
  the same long system prompt);
- a request may send `cache_salt` (vLLM's field): its scope is then the key's (or
  group's) and the salt together, so that requests with different salts share nothing
  even under one key, and those with the same salt share as usual.

OpenAI and Anthropic keep prompt caches per organization in the same spirit. Pure.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import msgspec

from supervisor.config.keys import Key

# `cache_salt` as the request schemas take it: vLLM refuses an empty salt; a salt longer
# than 256 characters is a mistake or an attack (vLLM sets no bound, and any real salt, a
# user id or a hash, is far shorter). msgspec's 400 names the field.
Salt = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


def cache_scope(key: Key | None, salt: str | None = None) -> str:
    """The scope of a request sent with `key` (None: no key) and `salt` (None: none): an
    opaque string, equal for requests that may share cached prefixes and only for them."""
    if key is None:
        base = ""
    elif key.cache_group is not None:
        base = "group\0" + key.cache_group
    else:
        base = "key\0" + key.owner
    if salt is not None:
        base += "\0salt\0" + salt
    return hashlib.sha256(base.encode("utf-8", "surrogatepass")).hexdigest()[:32] if base else ""
