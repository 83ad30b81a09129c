"""Saved prompts (prompt_cache_dir) are read back only into a context whose cells they fit
(worker/link.py, cache_options): a restart under other KV types or flash attention would have
llama.cpp refuse them, and under another RoPE or metadata override would restore cells that
read back silently wrong (keys are stored rotated). Each such option is in the fingerprint;
options that do not touch a cell's bytes are not (issue 43)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from worker.kv_rules import Attention
from worker.link import cache_options
from worker.protocol import WorkerSpec
from worker.protocol.load_options import CELL_OPTIONS


def _fingerprint(model_file: Path, **options: object) -> str:
    spec = WorkerSpec(name="m", path=str(model_file), prompt_cache_dir="/tmp/x", **options)  # type: ignore[arg-type]
    model = SimpleNamespace(attention=Attention(), n_ctx=4096, template_source="t")
    return cache_options(spec, model).fingerprint  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"cache_type_k": "q8_0"}, {"cache_type_v": "q4_0", "flash_attn": "on"}, {"flash_attn": "off"},
        {"rope_freq_base": 500000.0}, {"rope_freq_scale": 0.5}, {"rope_scaling": "yarn"}, {"yarn_orig_ctx": 8192},
        {"override_kv": ["tokenizer.ggml.add_bos_token=bool:false"]},
    ],
)
def test_an_option_a_cell_depends_on_changes_the_fingerprint(tmp_path: Path, change: dict[str, object]) -> None:
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")
    assert _fingerprint(model_file, **change) != _fingerprint(model_file)


def test_options_that_leave_cells_alone_keep_it(tmp_path: Path) -> None:
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")
    assert _fingerprint(model_file, mmap=False, mlock=True, threads_batch=2, check_tensors=True) == _fingerprint(model_file)
    assert {"cache_type_k", "cache_type_v", "flash_attn", "rope_freq_base"} <= set(CELL_OPTIONS)
