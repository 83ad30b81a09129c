"""worker/media/sounds.py: a client's audio bytes into mono float32 samples at the
projector's rate, or a 400 naming the part (issue 42, item 6). Every refusal happens in
Python, before a sample reaches libmtmd (which aborts the process on one sample, and turns
NaN into NaN embeddings without a word)."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.media import sounds
from worker.media.sounds import MAX_SECONDS, Budget, decode
from worker.protocol import audio_format as sniff
from worker.rejected import RequestRejected

RATE = 16_000


def tone(seconds: float, rate: int = RATE, hz: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate), dtype=np.float32) / rate
    x = (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def encoded(samples: np.ndarray, rate: int = RATE, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def refused(data: bytes, budget: Budget | None = None) -> str:
    with pytest.raises(RequestRejected) as info:
        decode(data, "messages[0].content[1].input_audio.data", RATE, budget)
    assert info.value.param == "messages[0].content[1].input_audio.data" and info.value.code == "invalid_request"
    assert info.value.message.startswith("Invalid audio at 'messages[0].content[1].input_audio.data': ")
    return info.value.message


WAV = encoded(tone(1.0))


def _huge_declared_length() -> bytes:
    """A WAV whose RIFF and data chunk sizes claim 2 GiB, over one second of samples."""
    data = bytearray(WAV)
    struct.pack_into("<I", data, 4, 0x7FFFFF24)
    struct.pack_into("<I", data, 40, 0x7FFFFF00)
    return bytes(data)


def _nan_wav() -> bytes:
    x = tone(0.5)
    x[100] = np.nan
    return encoded(x, subtype="FLOAT")


def _inf_wav() -> bytes:
    x = tone(0.5)
    x[-1] = np.inf
    return encoded(x, subtype="DOUBLE")


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buf, "PNG")
    return buf.getvalue()


BAD = {
    "empty": (b"", "empty"),
    "text": (b"Hello, this is not audio at all. " * 10, "not audio in a supported format"),
    "an image": (_png(), "not audio in a supported format"),
    "ogg": (encoded(tone(0.5), fmt="OGG", subtype="VORBIS"), "not audio in a supported format"),
    "aiff": (encoded(tone(0.5), fmt="AIFF"), "not audio in a supported format"),
    "truncated wav (in its header)": (WAV[:30], "could not be decoded (Error in WAV file"),
    "a WAV header and nothing after": (WAV[:44], "at least 0.1 s"),
    "one sample": (encoded(np.zeros(1, np.float32)), "at least 0.1 s"),
    "under 0.1 s": (encoded(tone(0.09)), "0.090 s long; at least 0.1 s"),
    "NaN float wav": (_nan_wav(), "not numbers (NaN or infinite)"),
    "infinite double wav": (_inf_wav(), "not numbers"),
    "a rate of 500 Hz": (encoded(tone(1.0, 500), 500), "a sample rate of 500 Hz is not accepted"),
    "over 10 minutes": (encoded(np.zeros(8000 * 601, np.int16), 8000, subtype="PCM_16"), "over 10 minutes"),
    "RIFF that is not WAVE": (b"RIFF\x10\x00\x00\x00AVI LIST" + b"\0" * 64, "not audio in a supported format"),
    "an MP3 sync word and noise": (b"\xff\xfb" + bytes(range(256)) * 4, "could not be decoded"),
    "ID3 and nothing": (b"ID3\x04\x00\x00\x00\x00\x00\x00", "could not be decoded"),
    "fLaC and nothing": (b"fLaC\x00\x00\x00\x22" + b"\0" * 34, "could not be decoded"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_input_is_refused_naming_the_part(case: str) -> None:
    data, says = BAD[case]
    assert says in refused(data)


def test_too_many_bytes_are_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sounds, "MAX_BYTES", 1000)
    assert "at most 1000 are accepted" in refused(WAV)


def test_a_huge_declared_length_reads_only_the_samples_there() -> None:
    s = decode(_huge_declared_length(), "x", RATE)
    assert len(s.samples) == RATE and s.rate == RATE


def test_a_wav_cut_short_in_its_samples_is_read_up_to_where_it_stops() -> None:
    """As players do, and as streaming writers need (a live recording's header may never
    get its length)."""
    s = decode(WAV[: 44 + RATE], "x", RATE)  # half of the 16-bit samples
    assert len(s.samples) == RATE // 2


def test_a_mono_wav_at_the_rate_arrives_as_sent() -> None:
    x = tone(1.0)
    s = decode(encoded(x, subtype="FLOAT"), "x", RATE)
    assert s.samples.dtype == np.float32 and np.array_equal(s.samples, x)
    assert s.seconds == 1.0


def test_stereo_is_averaged_to_mono() -> None:
    left, right = tone(1.0, hz=440), tone(1.0, hz=660)
    s = decode(encoded(np.stack([left, right], axis=1), subtype="FLOAT"), "x", RATE)
    assert np.allclose(s.samples, (left + right) / 2, atol=1e-6)


def test_8_khz_is_resampled_to_the_projectors_rate() -> None:
    s = decode(encoded(tone(2.0, 8000), 8000, subtype="PCM_16"), "x", RATE)
    assert s.rate == RATE and abs(len(s.samples) - 2 * RATE) <= 2
    # Still a 440 Hz tone: its spectrum peaks there.
    spectrum = np.abs(np.fft.rfft(s.samples))
    assert abs(np.argmax(spectrum) * RATE / len(s.samples) - 440) < 2


def test_a_48_khz_stereo_mp3_is_decoded_mixed_and_resampled() -> None:
    mp3 = encoded(tone(2.0, 48_000, channels=2), 48_000, fmt="MP3")
    assert sniff(mp3) == "mp3"
    s = decode(mp3, "x", RATE)
    # MP3 adds its encoder's delay and padding: a few frames of 1152 samples at 48 kHz.
    assert s.rate == RATE and 2 * RATE <= len(s.samples) <= 2 * RATE + 3 * 1152 // 3
    spectrum = np.abs(np.fft.rfft(s.samples))
    assert abs(np.argmax(spectrum) * RATE / len(s.samples) - 440) < 2


def test_flac_is_taken() -> None:
    flac = encoded(tone(1.0), fmt="FLAC")
    assert sniff(flac) == "flac" and len(decode(flac, "x", RATE).samples) == RATE


def test_loud_float_samples_are_clipped() -> None:
    x = tone(0.5) * 1e30
    s = decode(encoded(x, subtype="FLOAT"), "x", RATE)
    assert float(np.max(np.abs(s.samples))) == 1.0


def test_a_requests_audio_shares_ten_minutes() -> None:
    budget = Budget()
    four = encoded(np.zeros(8000 * 240, np.int16), 8000, subtype="PCM_16")
    decode(four, "x", RATE, budget)
    decode(four, "x", RATE, budget)
    assert budget.left == MAX_SECONDS - 480
    assert "the request's audio is over 10 minutes together" in refused(four, budget)


def test_sniff_tells_the_formats_apart() -> None:
    assert sniff(WAV) == "wav"
    assert sniff(b"ID3\x04" + b"\0" * 20) == "mp3"
    assert sniff(_png()) is None and sniff(b"") is None and sniff(b"\xff") is None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600), st.sampled_from([b"RIFF\x00\x00\x00\x00WAVE", b"ID3\x03\x00", b"\xff\xfb", b"fLaC", b""]))
def test_arbitrary_bytes_are_decoded_or_refused_never_anything_else(tail: bytes, head: bytes) -> None:
    try:
        s = decode(head + tail, "x", RATE)
    except RequestRejected as exc:
        assert exc.param == "x"
    else:
        assert s.samples.dtype == np.float32 and len(s.samples) >= RATE // 10
        assert np.isfinite(s.samples).all()
