"""The bytes of every token of a vocabulary, as llguidance's tokenizer takes them, kept on
disk between loads.

Structured output needs llguidance's view of the vocabulary, built while a model loads
(worker/link.py). On the demo model's 262k tokens that was about 2 s of a 3 s load, every
load: about 0.8 s of it asking llama.cpp for each token's bytes and attributes, 524k ctypes
calls in a Python loop, the rest llguidance's own build. The bytes depend on the model file
and the llama.cpp build alone, so the first load writes them to the user's cache folder
and later loads read them back in milliseconds.

A file is used only when it says it was written for this model file (path, size,
modification time), this llama.cpp and this vocabulary size, its checksum holds, and a
sample of its tokens (evenly spaced, and every end-of-generation token) matches what
llama.cpp gives now; anything else is rebuilt and written again. The folder is
$CORRAL_CACHE_DIR, else systemd's $CACHE_DIRECTORY, else $XDG_CACHE_HOME/corral, else
~/.cache/corral; where it cannot be written, the bytes are built every load, as before.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import llama_cpp

log = logging.getLogger(__name__)

MAGIC = b"corral-vocab-pieces 1\n"
SAMPLE = 512  # tokens checked against llama.cpp on every read (about 2 ms)
PIECE_CAP = 16 * 1024  # llguidance's own bound on one token's bytes


@dataclass(frozen=True)
class Pieces:
    tokens: list[bytes]  # a control token's bytes start with 0xff, as llguidance reads them
    eog: list[int]  # every end-of-generation token


def piece(vocab: llama_cpp.llama_vocab_p, token: int, buf: ctypes.Array[ctypes.c_char]) -> bytes:
    """One token's bytes as llguidance.llamacpp.lltokenizer_from_vocab takes them."""
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, PIECE_CAP, 0, True)
    if n < 0:
        raise ValueError(f"token {token} has more than {PIECE_CAP} bytes")
    tok = ctypes.string_at(buf, n)
    attr = llama_cpp.llama_vocab_get_attr(vocab, token)
    # A control token, or a user-defined one that looks like one, is special to llguidance.
    if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
        attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED and tok.startswith(b"<") and tok.endswith(b">")
    ):
        tok = b"\xff" + tok
    return tok


def build(vocab: llama_cpp.llama_vocab_p, n_vocab: int, is_eog: Callable[[int], bool]) -> Pieces:
    buf = ctypes.create_string_buffer(PIECE_CAP + 1)
    return Pieces([piece(vocab, t, buf) for t in range(n_vocab)], [t for t in range(n_vocab) if is_eog(t)])


def cache_folder(env: Mapping[str, str]) -> Path | None:
    if env.get("CORRAL_CACHE_DIR"):
        return Path(env["CORRAL_CACHE_DIR"])
    if env.get("CACHE_DIRECTORY"):  # systemd's CacheDirectory=; the first if several
        return Path(env["CACHE_DIRECTORY"].split(":")[0]) / "corral"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "corral"
    if env.get("HOME"):
        return Path(env["HOME"]) / ".cache" / "corral"
    return None


def identity(model_path: str, llama_version: str, n_vocab: int) -> dict[str, object]:
    st = os.stat(model_path)
    return {
        "model": os.path.realpath(model_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
        "llama_cpp": llama_version, "n_vocab": n_vocab,
    }


def file_for(folder: Path, ident: Mapping[str, object]) -> Path:
    name = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    return folder / "vocab" / f"{name}.pieces"


def encode(ident: Mapping[str, object], pieces: Pieces) -> bytes:
    lengths = struct.pack(f"<{len(pieces.tokens)}I", *map(len, pieces.tokens))
    payload = lengths + b"".join(pieces.tokens)
    header = {**ident, "eog": pieces.eog, "sha256": _digest(pieces.eog, payload)}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def _digest(eog: object, payload: bytes) -> str:
    """The file's checksum: its pieces and its end-of-generation list, which a changed digit
    in the header would otherwise alter unseen (a model that never stops, or stops early)."""
    return hashlib.sha256(json.dumps(eog).encode() + b"\n" + payload).hexdigest()


def decode(data: bytes, ident: Mapping[str, object]) -> Pieces | None:
    """The pieces in `data` if it is a whole file written for `ident`, else None."""
    if not data.startswith(MAGIC) or (end := data.find(b"\n", len(MAGIC))) < 0:
        return None
    try:
        header = json.loads(data[len(MAGIC) : end])
    except ValueError:
        return None
    if not isinstance(header, dict) or any(header.get(k) != v for k, v in ident.items()):
        return None
    payload = data[end + 1 :]
    eog = header.get("eog")
    if header.get("sha256") != _digest(eog, payload):
        return None
    n = int(ident["n_vocab"])  # type: ignore[call-overload]
    if len(payload) < 4 * n or not isinstance(eog, list) or not all(isinstance(t, int) and 0 <= t < n for t in eog):
        return None
    lengths = struct.unpack_from(f"<{n}I", payload)
    if 4 * n + sum(lengths) != len(payload):
        return None
    tokens, at = [], 4 * n
    for length in lengths:
        tokens.append(payload[at : at + length])
        at += length
    return Pieces(tokens, eog)


def agrees(pieces: Pieces, vocab: llama_cpp.llama_vocab_p, is_eog: Callable[[int], bool]) -> bool:
    """A sample of the tokens, and every end-of-generation one, as llama.cpp gives them now."""
    n = len(pieces.tokens)
    buf = ctypes.create_string_buffer(PIECE_CAP + 1)
    sample = set(range(0, n, max(1, n // SAMPLE))) | {n - 1} | set(pieces.eog)
    return all(is_eog(t) for t in pieces.eog) and all(piece(vocab, t, buf) == pieces.tokens[t] for t in sample)


def for_model(model_path: str, llama_version: str, vocab: llama_cpp.llama_vocab_p, n_vocab: int,
              is_eog: Callable[[int], bool]) -> Pieces:
    """A loaded model's pieces, from the cache folder where it holds them."""
    return load_or_build(
        identity(model_path, llama_version, n_vocab), cache_folder(os.environ),
        lambda: build(vocab, n_vocab, is_eog), lambda p: agrees(p, vocab, is_eog),
    )


def load_or_build(
    ident: Mapping[str, object], folder: Path | None, build: Callable[[], Pieces], check: Callable[[Pieces], bool]
) -> Pieces:
    """The pieces from `folder` when a file there holds them for `ident` and they pass
    `check`, else `build()`, written there for the next load."""
    if folder is None:
        return build()
    path = file_for(folder, ident)
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if data and (pieces := decode(data, ident)) is not None and check(pieces):
        return pieces
    if data:
        log.info("vocabulary cache %s is not this model's or is damaged; building it again", path)
    pieces = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole under a temporary name, then renamed: a reader never sees half.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pieces-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(encode(ident, pieces))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        forget_older(path, ident)
    except OSError as exc:
        log.debug("vocabulary cache not written to %s: %s", path, exc)
    return pieces


def forget_older(kept: Path, ident: Mapping[str, object]) -> None:
    """Remove the files written for the same model path before it changed (or before
    llama.cpp did), and those of model files that are gone: one file a model that exists,
    not one for every version of it or every temporary copy."""
    for other in kept.parent.glob("*.pieces"):
        if other == kept:
            continue
        try:
            with open(other, "rb") as f:
                head = f.readline() + f.readline(1 << 20)
            header = json.loads(head[len(MAGIC) :]) if head.startswith(MAGIC) else None
            model = header.get("model") if isinstance(header, dict) else None
            if isinstance(model, str) and (model == ident["model"] or not os.path.exists(model)):
                other.unlink()
        except (OSError, ValueError):
            continue
