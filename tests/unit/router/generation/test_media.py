"""router/generation/media.py's audio: which of llama-server's multimodal_data are sounds, told
by their first bytes as llama-server (mtmd_helper_bitmap_init_from_buf) and the worker tell
them (issue 42, item 6)."""

from __future__ import annotations

import base64

from router.generation import media
from worker.protocol import MEDIA_MARKER

WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def test_multimodal_data_that_is_audio_by_its_first_bytes_is_audio() -> None:
    data = [base64.b64encode(x).decode() for x in (PNG, WAV, b"ID3\x04\0\0\0\0\0\0", b"fLaC\0\0\0\x22")]
    text, items = media.multimodal_prompt({"prompt_string": "<__media__>" * 4, "multimodal_data": data}, "prompt")
    assert text == MEDIA_MARKER * 4
    assert [m.kind for m in items] == ["image", "audio", "audio", "audio"]
    assert [m.param for m in items] == [f"prompt.multimodal_data[{i}]" for i in range(4)]
