"""An audio part's bytes into mono float32 samples at the projector's rate, bounded before
any sample reaches C code that is not a decoder made for untrusted files.

The bytes are a client's: a header can claim hours or a sample rate of one, a file can be
cut short, or hold float samples that are NaN, infinite or 10^30. libsndfile decodes them
(through the `soundfile` package: WAV, MP3 by mpg123, FLAC; maintained, fuzzed by
OSS-Fuzz, and what Python's audio tools read with), and python-soxr resamples. libmtmd's own
loader (miniaudio, mtmd_helper_bitmap_init_from_buf) never sees a client's bytes, and
libmtmd gets what it asserts on never holding: at least MIN_SECONDS of finite samples
(one sample aborts the process in mtmd.cpp; NaN makes every embedding NaN, silently).

Limits: `MAX_BYTES` of encoded audio (as an image); WAV, MP3 and FLAC only, told by their
first bytes before libsndfile is asked (fewer parsers, less attack surface); at most
`MAX_SECONDS` of audio in one request, counted as it is decoded (a header's length is never
trusted); a rate between `RATES`. Every refusal is a 400 naming the part.

Why ten minutes: libmtmd cuts audio into 30 s windows, and 10 minutes is 20 of them: 3,000
tokens with the test projector, 3,750 with Ultravox's, which fits the contexts audio models
run with, and 38 MB of samples at 16 kHz. Decoding and resampling 10 minutes of 44.1 kHz
stereo MP3 took 1.2 s here, and libmtmd's mel spectrogram of it 1.0 s more, of the preparing
thread, which every request on the model passes; a longer recording is for the client to cut
(OpenAI's transcriptions take 25 MB).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from worker.protocol import audio_format
from worker.rejected import RequestRejected

if TYPE_CHECKING:
    import soundfile

MAX_BYTES = 20 * 1024 * 1024  # as an image's (OpenAI's transcriptions take 25 MB)
MAX_SECONDS = 600  # in one request, all its audio together
MIN_SECONDS = 0.1  # OpenAI's transcriptions refuse shorter audio the same way
RATES = (1_000, 384_000)  # the sample rates taken, Hz
# libsndfile's names for what is taken, and what a client calls them.
FORMATS = {"WAV": "wav", "WAVEX": "wav", "RF64": "wav", "MP3": "mp3", "FLAC": "flac"}
_BLOCK = 1 << 18  # samples read at a time (all channels): memory is the output's, not the file's


@dataclass(frozen=True)
class Sound:
    rate: int
    samples: np.ndarray = field(repr=False)  # mono float32 in [-1, 1], at `rate`

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


@dataclass
class Budget:
    """The seconds of audio a request may still decode (MAX_SECONDS in all)."""

    left: float = MAX_SECONDS


def refuse(param: str, why: str) -> RequestRejected:
    return RequestRejected("invalid_request", f"Invalid audio at '{param}': {why}", param)


def decode(data: bytes, param: str, rate: int, budget: Budget | None = None) -> Sound:
    """The mono samples of `data` at `rate` Hz, or a RequestRejected naming `param`."""
    import soundfile as sf

    if not data:
        raise refuse(param, "the audio is empty.")
    if len(data) > MAX_BYTES:
        raise refuse(param, f"the audio is {len(data)} bytes; at most {MAX_BYTES} are accepted.")
    if audio_format(data) is None:
        raise refuse(param, "not audio in a supported format (WAV, MP3 or FLAC).")
    left = MAX_SECONDS if budget is None else budget.left
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.format not in FORMATS:
                raise refuse(param, "not audio in a supported format (WAV, MP3 or FLAC).")
            if not RATES[0] <= f.samplerate <= RATES[1] or f.channels < 1:
                raise refuse(param, f"a sample rate of {f.samplerate} Hz is not accepted ({RATES[0]} to {RATES[1]}).")
            samples = _mono(f, param, rate, left)
    except RequestRejected:
        raise
    except sf.LibsndfileError as exc:  # cut short in its header, or not what its first bytes said
        raise refuse(param, f"the audio could not be decoded ({exc.error_string}).") from None
    except (RuntimeError, ValueError, OSError, EOFError) as exc:
        raise refuse(param, f"the audio could not be decoded ({exc}).") from None
    if len(samples) < MIN_SECONDS * rate:
        raise refuse(param, f"the audio is {len(samples) / rate:.3f} s long; at least {MIN_SECONDS} s is needed.")
    sound = Sound(rate, samples)
    if budget is not None:
        budget.left -= sound.seconds
    return sound


def _mono(f: soundfile.SoundFile, param: str, rate: int, seconds: float) -> np.ndarray:
    """`f`'s channels averaged, resampled to `rate` block by block, clipped to [-1, 1]; at
    most `seconds` of them (a RequestRejected past that, or at a NaN or infinite sample)."""
    import soxr

    most = int(seconds * f.samplerate)  # source frames allowed
    step = max(1, _BLOCK // f.channels)
    stream = None if f.samplerate == rate else soxr.ResampleStream(f.samplerate, rate, 1, dtype="float32")
    out: list[np.ndarray] = []
    read = 0
    while True:
        block = f.read(step, dtype="float32", always_2d=True)
        n = len(block)
        read += n
        if read > most:
            raise refuse(
                param,
                f"the request's audio is over {MAX_SECONDS // 60} minutes"
                + (" together." if seconds < MAX_SECONDS else f" ({MAX_SECONDS // 60} minutes at most)."),
            )
        if not np.isfinite(block).all():
            raise refuse(param, "the audio holds samples that are not numbers (NaN or infinite).")
        mono = block.mean(axis=1, dtype=np.float32) if f.channels > 1 else block[:, 0]
        last = n < step
        if stream is not None:
            mono = stream.resample_chunk(mono, last=last)
        out.append(np.clip(mono, -1.0, 1.0).astype(np.float32, copy=False))
        if last:
            break
    return np.concatenate(out) if out else np.zeros(0, np.float32)
