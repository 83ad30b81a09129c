"""Whether a model file can load at all: missing, not a GGUF file, or cut short."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import llama_cpp
import pytest

from supervisor.config import gguf_meta
from supervisor.config.gguf_meta import problem


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_with_tensors(tensors: list[tuple[str, list[int], int]], alignment: int | None = None) -> bytes:
    """A GGUF file with these (name, shape, ggml type) tensors laid out one after another,
    their data zeroes, as a converter writes it."""
    pairs = b""
    n_kv = 1
    pairs += _s("general.architecture") + struct.pack("<I", 8) + _s("test")
    if alignment is not None:
        pairs += _s("general.alignment") + struct.pack("<II", 4, alignment)
        n_kv += 1
    align = alignment or 32
    infos, offset, end = b"", 0, 0
    for name, shape, ttype in tensors:
        per_block, block_bytes = gguf_meta._BLOCKS[ttype]
        n = 1
        for d in shape:
            n *= d
        size = n // per_block * block_bytes
        infos += _s(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        infos += struct.pack("<IQ", ttype, offset)
        end = offset + size
        offset = -(-end // align) * align
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + pairs + infos
    head += b"\0" * (-len(head) % align)
    return head + b"\0" * end


TENSORS = [("tok_embd", [64, 32], 0), ("blk.0.w", [256, 4], 12), ("out", [32, 64], 8)]


@pytest.mark.parametrize("alignment", [None, 64])
def test_a_whole_file_passes_and_one_byte_short_is_truncated(tmp_path: Path, alignment: int | None) -> None:
    data = gguf_with_tensors(TENSORS, alignment)
    whole = tmp_path / "whole.gguf"
    whole.write_bytes(data)
    assert problem(whole) is None
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:-1])
    why = problem(short)
    assert why is not None and why.reason == f"truncated: {len(data) - 1:,} bytes where its header describes {len(data):,}"


def test_cut_inside_the_header(tmp_path: Path) -> None:
    data = gguf_with_tensors(TENSORS)
    p = tmp_path / "m.gguf"
    p.write_bytes(data[:60])
    why = problem(p)
    assert why is not None and why.reason == "not a GGUF model file (truncated header)"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "not a GGUF model file (no GGUF magic)"),
        (b"<html>not found</html>", "not a GGUF model file (no GGUF magic)"),
        (b"GGUF" + struct.pack("<IQQ", 9, 0, 0), "not a GGUF model file (unsupported GGUF version 9)"),
        (b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0), "not a GGUF model file (implausible header counts)"),
    ],
)
def test_not_a_gguf_file(tmp_path: Path, content: bytes, reason: str) -> None:
    p = tmp_path / "m.gguf"
    p.write_bytes(content)
    why = problem(p)
    assert why is not None and why.reason == reason and str(p) in str(why)


def test_missing_and_folder(tmp_path: Path) -> None:
    missing = problem(tmp_path / "gone.gguf")
    assert missing is not None and str(missing) == f"no such file: {tmp_path / 'gone.gguf'}"
    folder = problem(tmp_path)
    assert folder is not None and folder.reason == "a folder, not a GGUF model file"


def test_a_rewritten_file_is_read_again(tmp_path: Path) -> None:
    """The check caches by size and mtime: a file replaced since is judged anew."""
    p = tmp_path / "m.gguf"
    data = gguf_with_tensors(TENSORS)
    p.write_bytes(data[:-1])
    assert problem(p) is not None
    p.write_bytes(data)
    assert problem(p) is None


def test_block_sizes_match_libggml() -> None:
    """The table of ggml types against the library that will load the file."""
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_type_size.restype = ctypes.c_size_t
    known = {t: (lib.ggml_blck_size(t), lib.ggml_type_size(t)) for t in range(llama_cpp.GGML_TYPE_COUNT)}
    assert gguf_meta._BLOCKS == {t: sizes for t, sizes in known.items() if sizes[0] > 0}
