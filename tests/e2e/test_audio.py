"""Audio, with the official clients, against examples/audio.toml as shipped (the demo model
with the random-weight Ultravox-style projector of bench/audio_projector.py: its answers
about a sound mean nothing, so what is checked is what can be: the same sound gives the same
distribution, other sounds others, a sound's tokens are counted (150 a 30 s window), a
second turn reuses the sound from the cache without encoding it again, a transcription comes
back as OpenAI's object, and every bad sound is a 400 naming its part that leaves the worker
serving). A vision-only and a text-only model beside it refuse audio before they load.

Issue 42, item 6. The behaviours followed: OpenAI's input_audio parts
(platform.openai.com/docs/guides/audio), and llama-server's /v1/audio/transcriptions and
multimodal_data (tools/server/server-chat.cpp, convert_transcriptions_to_chatcmpl;
server-task.cpp, to_json_oaicompat_asr).
"""

from __future__ import annotations

import base64
import io
import re
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import ollama
import openai
import pytest
import soundfile as sf

from bench import audio_projector, projector
from tests.e2e.conftest import ROOT, Server, pooled_briefly, start_server, stop_server

pytestmark = pytest.mark.usefixtures("sdk_warnings_are_errors")

WINDOW = audio_projector.tokens_per_window()  # 150 tokens a 30 s window
RATE = audio_projector.SAMPLE_RATE


def audio_config(mmproj: Path, vision: Path) -> str:
    """examples/audio.toml as shipped, with this run's model, projector and port, and a
    vision-only and a text-only model beside it."""
    text = (ROOT / "examples" / "audio.toml").read_text()
    for pattern, new in (
        (r'(?m)^path = "\.\./models/gemma-3-270m-Q4_K_M\.gguf"$', 'path = "{MODEL}"'),
        (r'(?m)^mmproj = "\.\./models/mmproj-audio-test\.gguf"', f'mmproj = "{mmproj}"'),
        (r"(?m)^port = 8080\b", "port = {PORT}"),
    ):
        text, n = re.subn(pattern, new, text)
        assert n == 1, f"examples/audio.toml no longer matches {pattern}"
    # Pings each second: the encode counter comes with each Pong.
    return text + (
        f'\n[models.vision-only]\npath = "{{MODEL}}"\nmmproj = "{vision}"\nchat_template = "gemma"\nn_ctx = 1024\n'
        '\n[models.text-only]\npath = "{MODEL}"\nchat_template = "gemma"\nn_ctx = 1024\nslots = 1\n'
        "\n[supervisor]\nhealth_interval = 1\n"
    )


@pytest.fixture(scope="module")
def hearing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("audio")
    audio_projector.write(tmp / "mmproj-audio-test.gguf")
    projector.write(tmp / "mmproj-test.gguf")
    srv = start_server(tmp, audio_config(tmp / "mmproj-audio-test.gguf", tmp / "mmproj-test.gguf"))
    yield srv
    assert stop_server(srv) == 0


def sound(seconds: float = 1.0, seed: int = 0, rate: int = RATE, fmt: str = "WAV", channels: int = 1) -> bytes:
    """Noise (seed > 0) or a 440 Hz tone (seed 0), encoded."""
    n = int(seconds * rate)
    if seed:
        x = (np.random.default_rng(seed).standard_normal((n, channels)) * 0.3).astype(np.float32)
    else:
        x = np.repeat((0.5 * np.sin(2 * np.pi * 440 * np.arange(n) / rate)).astype(np.float32)[:, None], channels, 1)
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt)
    return buf.getvalue()


TONE, NOISE = sound(), sound(seed=1)


def part(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


@pytest.fixture(scope="module")
def oa(hearing: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=hearing.base, api_key="x", max_retries=0, http_client=pooled_briefly()) as c:
        yield c


def ask(oa: openai.OpenAI, data: bytes | None, question: str = "What is this sound?", model: str = "audio",
        fmt: str = "wav", **kw: Any) -> Any:
    content: list[Any] = [{"type": "text", "text": question}]
    if data is not None:
        content.append(part(data, fmt))
    kw.setdefault("max_tokens", 8)
    return oa.chat.completions.create(model=model, temperature=0, messages=[{"role": "user", "content": content}], **kw)


def encoded(server: Server) -> float:
    """corral_model_images_encoded_total of the audio model (images and audio windows), once
    two Pongs in a row agree on it."""
    deadline, last = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        m = re.search(r'^corral_model_images_encoded_total{model="gemma-audio"} (\S+)$',
                      httpx.get(server.url + "/metrics").text, re.M)
        value = None if m is None else float(m.group(1))
        if value is not None and value == last:
            return value
        last = value
        time.sleep(1.2)
    raise AssertionError(f"the encode counter did not settle (last {last})")


def test_models_props_and_show_say_which_model_hears_audio(hearing: Server, oa: openai.OpenAI) -> None:
    models = {m.id: m.model_extra or {} for m in oa.models.list().data}
    assert models["gemma-audio"]["modalities"] == {"vision": False, "audio": True}
    assert models["gemma-audio"]["architecture"]["input_modalities"] == ["text", "audio"]
    assert models["vision-only"]["modalities"] == {"vision": True, "audio": False}
    ask(oa, None)  # loaded: /props speaks for the worker
    props = httpx.get(hearing.url + "/props", params={"model": "gemma-audio"}).json()
    assert props["modalities"] == {"vision": False, "audio": True}
    admin = {m["name"]: m for m in httpx.get(hearing.url + "/admin/models").json()["models"]}
    assert admin["gemma-audio"]["modalities"] == ["audio"]  # the dashboard's "hears audio"
    caps = ollama.Client(host=hearing.url).show("gemma-audio").capabilities or []
    assert "audio" in caps and "vision" not in caps


def test_an_input_audio_part_answers_and_counts_a_window_of_tokens(oa: openai.OpenAI) -> None:
    with_audio, without = ask(oa, TONE), ask(oa, None)
    assert with_audio.choices[0].message.content
    assert with_audio.usage.prompt_tokens - without.usage.prompt_tokens == WINDOW  # the projector adds no delimiters
    longer = ask(oa, sound(31.0), max_tokens=1)  # two 30 s windows
    assert longer.usage.prompt_tokens - without.usage.prompt_tokens == 2 * WINDOW


def first_token(oa: openai.OpenAI, data: bytes | None) -> dict[str, float]:
    r = ask(oa, data, max_tokens=1, logprobs=True, top_logprobs=8)
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content
    return {t.token: t.logprob for t in r.choices[0].logprobs.content[0].top_logprobs}


def alike(a: dict[str, float], b: dict[str, float], within: float) -> bool:
    """`a`'s three likeliest tokens are among `b`'s eight, each as likely to `within`."""
    return all(t in b and abs(a[t] - b[t]) <= within for t in sorted(a, key=a.__getitem__, reverse=True)[:3])


def test_the_same_sound_repeats_and_other_sounds_or_none_differ(oa: openai.OpenAI) -> None:
    # By distribution, as tests/e2e/test_images.py compares images: a near tie of random
    # weights can flip with how the prompt was split into batches.
    tone = first_token(oa, TONE)
    assert alike(tone, first_token(oa, TONE), 0.1)
    for other in (first_token(oa, NOISE), first_token(oa, None), first_token(oa, sound(seed=2))):
        assert not alike(tone, other, 0.5) and not alike(other, tone, 0.5), (tone, other)


def test_a_48_khz_stereo_mp3_is_heard_as_its_wav_is(oa: openai.OpenAI) -> None:
    mp3 = sound(1.0, rate=48_000, fmt="MP3", channels=2)
    r = ask(oa, mp3, fmt="mp3")
    assert r.usage.prompt_tokens == ask(oa, TONE).usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as info:
        ask(oa, mp3, fmt="wav")
    assert info.value.body["param"] == "messages[0].content[1].input_audio.format"  # type: ignore[index]


def test_a_second_turn_reuses_the_sound_from_the_cache_without_encoding_it(hearing: Server, oa: openai.OpenAI) -> None:
    data = sound(2.0, seed=7)
    first = ask(oa, data, "Listen.")
    before = encoded(hearing)
    turn: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "Listen."}, part(data)]},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And now?"},
    ]
    second: Any = oa.chat.completions.create(model="audio", temperature=0, max_tokens=4, messages=turn)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1 > WINDOW, (cached, first.usage.prompt_tokens)
    assert encoded(hearing) == before
    # Another sound shares no cached cells past the text before it.
    other = ask(oa, sound(2.0, seed=8), "Listen.")
    assert other.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - WINDOW


def test_a_transcription_comes_back_as_openais_object(hearing: Server, oa: openai.OpenAI, tmp_path: Path) -> None:
    wav = tmp_path / "tone.wav"
    wav.write_bytes(TONE)
    short = {"max_tokens": 8}  # a form field as llama-server reads it (the client's own has none)
    with wav.open("rb") as f:
        t = oa.audio.transcriptions.create(model="audio", file=f, language="en", temperature=0.0, extra_body=short)
    assert t.text and t.usage is not None and t.usage.type == "tokens" and t.usage.input_tokens > WINDOW
    assert t.usage.output_tokens <= 8
    with wav.open("rb") as f:
        events = list(oa.audio.transcriptions.create(model="audio", file=f, stream=True, temperature=0.0, extra_body=short))
    assert events[-1].type == "transcript.text.done" and all(e.type == "transcript.text.delta" for e in events[:-1])
    assert "".join(e.delta for e in events[:-1]) == events[-1].text  # type: ignore[union-attr]
    with wav.open("rb") as f, pytest.raises(openai.BadRequestError) as info:
        oa.audio.transcriptions.create(model="audio", file=f, response_format="text")
    assert info.value.body["param"] == "response_format"  # type: ignore[index]


def test_counted_input_tokens_and_llama_servers_multimodal_data_take_audio(hearing: Server, oa: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this sound?"}, part(TONE)]}]
    counted = httpx.post(hearing.base + "/chat/completions/input_tokens", json={"model": "audio", "messages": messages}, timeout=60)
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == ask(oa, TONE).usage.prompt_tokens
    body = {"model": "audio", "n_predict": 4, "temperature": 0, "prompt": {
        "prompt_string": "<start_of_turn>user\nHear <__media__> now.<end_of_turn>\n<start_of_turn>model\n",
        "multimodal_data": [base64.b64encode(TONE).decode()]}}  # audio by its first bytes, as llama-server tells it
    r = httpx.post(hearing.url + "/completion", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_evaluated"] > WINDOW


def _nan_wav() -> bytes:
    x = np.zeros(RATE, np.float32)
    x[5] = np.nan
    buf = io.BytesIO()
    sf.write(buf, x, RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue()


BAD_SOUNDS = {
    "truncated": (TONE[:30], "could not be decoded"),
    "one sample": (sound(1 / RATE), "at least 0.1 s"),
    "NaN": (_nan_wav(), "not numbers"),
    "not audio": (b"RIFF\x10\x00\x00\x00AVI LIST" + b"\0" * 64, "not audio in a supported format"),
}


@pytest.mark.parametrize("kind", sorted(BAD_SOUNDS))
def test_each_bad_sound_is_a_400_naming_its_part_and_the_worker_serves_on(hearing: Server, oa: openai.OpenAI, kind: str) -> None:
    data, says = BAD_SOUNDS[kind]
    ask(oa, None)  # loaded
    before = hearing.workers()["gemma-audio"]
    with pytest.raises(openai.BadRequestError) as info:
        ask(oa, data)
    body = info.value.body
    assert body["param"] == "messages[0].content[1].input_audio.data", body  # type: ignore[index]
    assert says in body["message"], body  # type: ignore[index]
    assert hearing.workers()["gemma-audio"] == before  # the same worker: nothing crashed


def test_a_model_without_an_audio_encoder_refuses_audio_before_it_loads(hearing: Server, oa: openai.OpenAI, tmp_path: Path) -> None:
    for model, why in (("text-only", "names no projector"), ("vision-only", "has no audio encoder")):
        with pytest.raises(openai.BadRequestError) as info:
            ask(oa, TONE, model=model)
        assert info.value.body["param"] == "messages[0].content[1].input_audio.data"  # type: ignore[index]
        assert "does not take audio" in info.value.body["message"] and why in info.value.body["message"]  # type: ignore[index]
    wav = tmp_path / "tone.wav"
    wav.write_bytes(TONE)
    with wav.open("rb") as f, pytest.raises(openai.BadRequestError) as info:
        oa.audio.transcriptions.create(model="text-only", file=f)
    assert info.value.body["param"] == "file"  # type: ignore[index]
    assert "vision-only" not in hearing.workers() and "text-only" not in hearing.workers()  # neither loaded
