"""Copies of a GGUF file with some header values changed and some tensors left out, for the
benchmarks and tests that need a variant of the demo model (a draft model of its first
layers, fill-in-the-middle token ids, a vocabulary that differs).

What is kept is copied as bytes, never decoded: gguf-py's GGUFReader spends about 10 s on
the demo model's header (its 262,144-token vocabulary parsed into a numpy view a part), and
its writer as long again; this reads the header in about half a second and copies the
tensor data with the kernel (os.copy_file_range where it can).

The format (ggml's docs/gguf.md): magic, version, tensor count, pair count; each pair a
string key, a type id and its value; each tensor's name, shape, type and offset into the
data, which starts at the next multiple of `general.alignment` (32 unless set) after the
header. Each tensor's data is padded to that alignment.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from supervisor.config.gguf_meta import ARRAY, SCALARS, STRING

MAGIC = b"GGUF"
UINT32 = 4

Value = Union[int, float, bool, str, list["Value"]]


@dataclass(frozen=True)
class Tensor:
    name: str
    info: bytes  # shape and type, as written after the name
    offset: int  # into the data
    span: int  # bytes to the next tensor's data (its data and padding), or to the file's end


@dataclass(frozen=True)
class Header:
    version: int
    pairs: dict[str, bytes]  # key -> its type id and value, as in the file, in order
    tensors: list[Tensor]  # in the header's order
    alignment: int
    data_start: int

    def get(self, key: str) -> Value:
        return decode(self.pairs[key])

    def integer(self, key: str) -> int:
        value = self.get(key)
        if not isinstance(value, int):
            raise ValueError(f"{key} is not an integer")
        return value

    def items(self, key: str) -> list[Value]:
        value = self.get(key)
        if not isinstance(value, list):
            raise ValueError(f"{key} is not an array")
        return value


def read(path: Path) -> Header:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
        pos = 24
        pairs: dict[str, bytes] = {}
        for _ in range(n_kv):
            key, pos = _string(mm, pos)
            start = pos
            (vtype,) = struct.unpack_from("<I", mm, pos)
            pos = _skip(mm, pos + 4, vtype)
            pairs[key] = bytes(mm[start:pos])
        aligned = decode(pairs["general.alignment"]) if "general.alignment" in pairs else 32
        alignment = aligned if isinstance(aligned, int) and aligned > 0 else 32
        infos: list[tuple[str, bytes, int]] = []
        for _ in range(n_tensors):
            name, pos = _string(mm, pos)
            (n_dims,) = struct.unpack_from("<I", mm, pos)
            end = pos + 4 + 8 * n_dims + 4
            (offset,) = struct.unpack_from("<Q", mm, end)
            infos.append((name, bytes(mm[pos:end]), offset))
            pos = end + 8
        data_start = _aligned(pos, alignment)
        data_size = len(mm) - data_start
    ends = sorted({o for _, _, o in infos} | {data_size})
    following = {o: ends[i + 1] for i, o in enumerate(ends[:-1])}
    tensors = [Tensor(name, info, offset, following[offset] - offset) for name, info, offset in infos]
    return Header(version, pairs, tensors, alignment, data_start)


def write(src: Path, dst: Path, header: Header, changes: dict[str, Value], tensors: list[Tensor]) -> Path:
    """`src` as `dst`: its pairs with `changes` applied (a key it has keeps its type; a new
    one is appended, an int as uint32) and `tensors` alone, in that order."""
    pairs = dict(header.pairs)
    for key, value in changes.items():
        pairs[key] = encode_like(pairs.get(key), value)
    out = bytearray(MAGIC + struct.pack("<IQQ", header.version, len(tensors), len(pairs)))
    for key, raw in pairs.items():
        out += _encode_string(key) + raw
    offset = 0
    placed: list[tuple[Tensor, int]] = []
    for t in tensors:
        out += _encode_string(t.name) + t.info + struct.pack("<Q", offset)
        placed.append((t, offset))
        offset += _aligned(t.span, header.alignment)
    out += b"\0" * (_aligned(len(out), header.alignment) - len(out))
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(out)
        for t, at in placed:
            fout.seek(len(out) + at)
            _copy(fin, fout, header.data_start + t.offset, t.span)
        fout.truncate(len(out) + offset)
    return dst


def first_layers(src: Path, dst: Path, layers: int, tokens: dict[int, str] | None = None) -> Path:
    """`src` with blocks 0 .. layers-1 alone: the block count and every per-layer list (a
    sliding-window pattern) cut to match, the name saying so; `tokens` replaces token
    texts (a vocabulary that differs)."""
    header = read(src)
    arch = str(header.get("general.architecture"))
    block_key = f"{arch}.block_count"
    total = header.integer(block_key)
    if not 1 <= layers <= total:
        raise ValueError(f"layers must be 1..{total}")
    changes: dict[str, Value] = {block_key: layers}
    if "general.name" in header.pairs:
        changes["general.name"] = f"{header.get('general.name')} (first {layers} of {total} layers)"
    for key, raw in header.pairs.items():
        if array_length(raw) == total and key != "tokenizer.ggml.tokens":
            changes[key] = header.items(key)[:layers]
    if tokens:
        texts = header.items("tokenizer.ggml.tokens")
        changes["tokenizer.ggml.tokens"] = [tokens.get(i, t) for i, t in enumerate(texts)]
    kept = [t for t in header.tensors if not (m := re.match(r"blk\.(\d+)\.", t.name)) or int(m.group(1)) < layers]
    return write(src, dst, header, changes, kept)


def with_values(src: Path, dst: Path, changes: dict[str, Value]) -> Path:
    """`src` with `changes` to its header and every tensor as it was."""
    header = read(src)
    return write(src, dst, header, changes, header.tensors)


# ---- values ------------------------------------------------------------------------------


def decode(raw: bytes) -> Value:
    value, _ = _decode(raw, 4, struct.unpack_from("<I", raw, 0)[0])
    return value


def array_length(raw: bytes) -> int | None:
    (vtype,) = struct.unpack_from("<I", raw, 0)
    return int(struct.unpack_from("<Q", raw, 8)[0]) if vtype == ARRAY else None


def encode_like(raw: bytes | None, value: Value) -> bytes:
    """`value` with the type of the pair `raw` (an array keeps its element type), or one
    inferred from the value where there is none."""
    if raw is None:
        vtype = STRING if isinstance(value, str) else ARRAY if isinstance(value, list) else 6 if isinstance(value, float) else UINT32
        etype = (STRING if value and isinstance(value[0], str) else UINT32) if isinstance(value, list) else None
    else:
        (vtype,) = struct.unpack_from("<I", raw, 0)
        etype = struct.unpack_from("<I", raw, 4)[0] if vtype == ARRAY else None
    return struct.pack("<I", vtype) + _encode(vtype, value, etype)


def _encode(vtype: int, value: Value, etype: int | None = None) -> bytes:
    if vtype in SCALARS:
        return struct.pack("<" + SCALARS[vtype], value)
    if vtype == STRING:
        assert isinstance(value, str)
        return _encode_string(value)
    assert vtype == ARRAY and isinstance(value, list) and etype is not None
    head = struct.pack("<IQ", etype, len(value))
    if etype in SCALARS:
        return head + struct.pack(f"<{len(value)}{SCALARS[etype]}", *value)
    return head + b"".join(_encode(etype, v) for v in value)


def _encode_string(s: str) -> bytes:
    data = s.encode("utf-8", "surrogateescape")  # a token's invalid UTF-8 goes back as it came
    return struct.pack("<Q", len(data)) + data


def _decode(buf: bytes | mmap.mmap, pos: int, vtype: int) -> tuple[Value, int]:
    if vtype in SCALARS:
        fmt = "<" + SCALARS[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype == STRING:
        return _string(buf, pos)
    if vtype != ARRAY:
        raise ValueError(f"unknown GGUF value type {vtype}")
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in SCALARS:
        fmt = f"<{count}{SCALARS[etype]}"
        return list(struct.unpack_from(fmt, buf, pos)), pos + struct.calcsize(fmt)
    items: list[Value] = []
    for _ in range(count):
        item, pos = _decode(buf, pos, etype)
        items.append(item)
    return items, pos


def _skip(buf: mmap.mmap, pos: int, vtype: int) -> int:
    """Past a value without decoding it (a vocabulary's strings are only measured)."""
    if vtype in SCALARS:
        return pos + struct.calcsize("<" + SCALARS[vtype])
    if vtype == STRING:
        return pos + 8 + int(struct.unpack_from("<Q", buf, pos)[0])
    if vtype != ARRAY:
        raise ValueError(f"unknown GGUF value type {vtype}")
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in SCALARS:
        return pos + int(count) * struct.calcsize("<" + SCALARS[etype])
    for _ in range(count):
        pos = _skip(buf, pos, etype)
    return pos


def _string(buf: bytes | mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", "surrogateescape"), pos + 8 + n


def _aligned(n: int, alignment: int) -> int:
    return int(-(-n // alignment) * alignment)


def _copy(fin: object, fout: object, start: int, length: int) -> None:
    src_fd, dst_fd = fin.fileno(), fout.fileno()  # type: ignore[attr-defined]
    dst_pos = os.lseek(dst_fd, 0, os.SEEK_CUR)
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(src_fd, dst_fd, length - done, start + done, dst_pos + done)
        except OSError:  # across file systems on older kernels: copy through memory
            os.lseek(dst_fd, dst_pos + done, os.SEEK_SET)
            n = os.write(dst_fd, os.pread(src_fd, min(length - done, 1 << 24), start + done))
        if n == 0:
            raise ValueError("the source ended before its last tensor")
        done += n
    os.lseek(dst_fd, dst_pos + length, os.SEEK_SET)
