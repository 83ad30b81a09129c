"""API and admin keys: where they come from, and which one a request presented.

Keys come from three places, all read when the config is loaded (so a reload re-reads the
keys file):

- `[server] api_keys`: strings, or tables `{ key = "...", name = "...", models = [...],
  cache_group = "...", max_tokens = N }` with the quotas and priority of
  supervisor/config/key_rules.py;
- `[server] api_keys_file`: one key a line, optionally followed by `name=NAME`,
  `models=A,B`, `cache_group=GROUP`, `max_tokens=N` and those rules as `attr=value`; blank
  lines and `#` comments are skipped;
- the environment variable `CORRAL_API_KEYS`: keys separated by commas or whitespace.

`[server] admin_keys` are strings. An admin key may do anything an API key may, on every
model.

A key is kept only as its SHA-256 digest, and named for logs and errors by its name or,
without one, by where it was configured (`api_keys[2]`, `keys.txt:7`,
`CORRAL_API_KEYS[0]`): no message, log line or admin answer can then hold the key itself.
A name is for people; what a key owns (stored responses, slot files, cached prefixes)
belongs to its digest, which no other key and no later key at the same place in the
config can have. A configured name may not take the form of a generated one, so that the
access log never shows two keys under one name.
Matching compares the presented key's digest with every configured digest in constant
time, and never stops early, so the time taken says nothing about which key, or how much
of one, matched. Pure, except `from_file`'s read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import msgspec

from supervisor.config import key_rules
from supervisor.config.key_rules import KeyRules

ENV = "CORRAL_API_KEYS"

# A key is a token for an HTTP header: printable ASCII without spaces. Anything else could
# never be sent as `Authorization: Bearer KEY`, so it is a config mistake.
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")
# Keys shorter than this are guessable; a config that sets one is refused.
MIN_KEY_LENGTH = 8


class ApiKeyTable(KeyRules, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A `{ key = ..., name = ..., models = [...] }` entry of `[server] api_keys`, with the
    quotas and priority of its KeyRules, which the table spells flat."""

    key: str
    name: str | None = None
    models: list[str] | None = None  # names or aliases; None: every model
    # Keys of one group share their cached prompt prefixes (and see each other's cache
    # hits); without one, a key's prefixes are its own (router/server/cache_scope.py).
    cache_group: str | None = None
    # The most tokens one request of this key may generate; a request asking more is cut
    # to it, as llama-server's -n cuts n_predict.
    max_tokens: int | None = None

    def rules(self) -> KeyRules:
        return key_rules.from_fields({f: getattr(self, f) for f in key_rules.FIELDS})


@dataclass(frozen=True)
class Key:
    name: str  # what logs and errors say: never the key
    digest: bytes
    admin: bool = False
    # The models (resolved names) this key may use; None: all of them.
    models: frozenset[str] | None = None
    cache_group: str | None = None  # ApiKeyTable.cache_group
    max_tokens: int | None = None  # ApiKeyTable.max_tokens
    rules: KeyRules = key_rules.NONE  # quotas and priority

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def owner(self) -> str:
        """Who owns what this key stores: its digest's hex. Another key, a renamed key, or
        the key that replaces it at the same place in the config owns something else."""
        return self.digest.hex()


def digest(key: str) -> bytes:
    # Hashing first makes every comparison the same length, whatever was sent.
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class Keyring:
    keys: tuple[Key, ...] = ()

    @property
    def api_keys_required(self) -> bool:
        """Whether inference routes need a key: any API key is configured."""
        return any(not k.admin for k in self.keys)

    @property
    def admin_keys_configured(self) -> bool:
        return any(k.admin for k in self.keys)

    def match(self, presented: str) -> Key | None:
        """The configured key equal to `presented`, compared in constant time."""
        d = digest(presented)
        found: Key | None = None
        for k in self.keys:
            if hmac.compare_digest(k.digest, d) and found is None:
                found = k
        return found


@dataclass(frozen=True)
class KeySource:
    """One key as configured, before its models are resolved."""

    where: str  # config path of the entry: problems name it
    key: str
    name: str | None
    models: tuple[str, ...] | None
    admin: bool = False
    cache_group: str | None = None
    max_tokens: int | None = None
    rules: KeyRules = key_rules.NONE


def from_config(api_keys: Iterable[str | ApiKeyTable], admin_keys: Iterable[str]) -> Iterator[KeySource]:
    for i, entry in enumerate(api_keys):
        where = f"server.api_keys[{i}]"
        if isinstance(entry, str):
            yield KeySource(where, entry, None, None)
        else:
            models = None if entry.models is None else tuple(entry.models)
            yield KeySource(
                where, entry.key, entry.name, models, cache_group=entry.cache_group, max_tokens=entry.max_tokens,
                rules=entry.rules(),
            )
    for i, key in enumerate(admin_keys):
        yield KeySource(f"server.admin_keys[{i}]", key, None, None, admin=True)


def from_env(value: str | None) -> Iterator[KeySource]:
    for i, key in enumerate((value or "").replace(",", " ").split()):
        yield KeySource(f"{ENV}[{i}]", key, None, None)


class KeyFileError(ValueError):
    """A line of a keys file that is not `KEY [name=NAME] [models=A,B] [cache_group=G]
    [max_tokens=N]` and key_rules' `attr=value`."""


_FILE_FIELDS = ("name", "models", "cache_group", "max_tokens", *key_rules.FIELDS)


def parse_file(text: str, label: str) -> Iterator[KeySource]:
    """The keys of a keys file's text; `label` names the file in `where`. Raises
    KeyFileError naming the line, never quoting it (it holds a key)."""
    for n, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        key, *rest = fields
        given: dict[str, str] = {}
        for field in rest:
            attr, sep, value = field.partition("=")
            if attr not in _FILE_FIELDS or not sep or not value:
                raise KeyFileError(
                    f"{label}:{n}: after the key, only name=NAME, models=A,B, cache_group=GROUP, "
                    f"max_tokens=N and {', '.join(f + '=' for f in key_rules.FIELDS)} may follow"
                )
            given[attr] = value
        models = tuple(m for m in given["models"].split(",") if m) if "models" in given else None
        max_tokens: int | None = None
        if "max_tokens" in given:
            if not given["max_tokens"].isdigit():
                raise KeyFileError(f"{label}:{n}: max_tokens must be a whole number")
            max_tokens = int(given["max_tokens"])
        try:
            rules = key_rules.from_fields(dict(given))
        except msgspec.ValidationError as exc:
            raise KeyFileError(f"{label}:{n}: {exc}") from None
        yield KeySource(
            f"{label}:{n}", key, given.get("name"), models, cache_group=given.get("cache_group"), max_tokens=max_tokens,
            rules=rules,
        )


def from_file(path: Path) -> list[KeySource]:
    """A keys file's keys, each named by the file's name and its line (`keys.txt:3`).
    Raises KeyFileError (a line), OSError or UnicodeDecodeError (the file)."""
    return list(parse_file(path.read_text(encoding="utf-8"), path.name))


# The names a key without one is given (`api_keys[2]`, `CORRAL_API_KEYS[0]`,
# `admin_keys[1]`, `keys.txt:7`): a configured name of this form could be, now or after the
# next reload, another key's.
_GENERATED_NAME = re.compile(r"[A-Za-z_]+\[\d+\]|\S+:\d+")


def problems(sources: Iterable[KeySource]) -> Iterator[str]:
    """What is wrong with the keys, each `where: message`, never quoting a key."""
    seen: dict[bytes, str] = {}
    names: dict[str, str] = {}
    for s in sources:
        if not _KEY_CHARS.fullmatch(s.key):
            yield f"{s.where}: a key must be printable ASCII without spaces"
        elif len(s.key) < MIN_KEY_LENGTH:
            yield f"{s.where}: a key must be at least {MIN_KEY_LENGTH} characters long"
        d = digest(s.key)
        if d in seen:
            yield f"{s.where}: the same key as {seen[d]}"
        seen.setdefault(d, s.where)
        if s.name is not None:
            if not s.name.strip() or not s.name.isprintable():
                yield f"{s.where}.name: must be printable and not empty"
            elif _GENERATED_NAME.fullmatch(s.name):
                yield (
                    f"{s.where}.name: {s.name!r} has the form of the name Corral gives a key without "
                    "one (where it is configured): choose another"
                )
            elif s.name in names:
                yield f"{s.where}.name: {s.name!r} is already the name of {names[s.name]}"
            names.setdefault(s.name, s.where)
        if s.cache_group is not None and (not s.cache_group.strip() or not s.cache_group.isprintable()):
            yield f"{s.where}.cache_group: must be printable and not empty"
        if s.max_tokens is not None and s.max_tokens < 1:
            yield f"{s.where}.max_tokens: must be at least 1"
        yield from key_rules.problems(s.rules, s.where)


def keyring(sources: Iterable[KeySource], resolve: dict[str, str]) -> tuple[Keyring, list[str]]:
    """The keyring, and the problems of scopes naming what `resolve` (name or alias ->
    model name) does not know. A key is named by its `name`, or by where it is configured."""
    keys: list[Key] = []
    bad: list[str] = []
    for s in sources:
        scope: frozenset[str] | None = None
        if s.models is not None:
            unknown = [m for m in s.models if m not in resolve]
            bad += [f"{s.where}.models: {m!r} is neither a model nor an alias in [models]" for m in unknown]
            scope = frozenset(resolve[m] for m in s.models if m in resolve)
        name = s.name or s.where.removeprefix("server.")
        keys.append(
            Key(
                name=name, digest=digest(s.key), admin=s.admin, models=scope,
                cache_group=s.cache_group, max_tokens=s.max_tokens, rules=s.rules,
            )
        )
    return Keyring(tuple(keys)), bad
