"""worker/protocol/: framing, round-trips for every frame type, and malformed input."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import msgspec
import pytest

from worker import protocol as p

SAMPLING = p.SamplingParams(
    max_tokens=32,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    min_p=0.05,
    seed=1234,
    repeat_penalty=1.1,
    repeat_last_n=-1,
    presence_penalty=0.5,
    frequency_penalty=-0.5,
    stop=["\n\n", "User:"],
    ignore_eos=True,
)

TO_WORKER: list[p.Frame] = [
    p.Generate(id=1, params=p.SamplingParams(), prompt="Once upon a time"),
    p.Generate(
        id=2,
        params=SAMPLING,
        messages=[
            p.ChatMessage(role="system", content="Be brief."),
            p.ChatMessage(role="user", content="héllo 🌍"),
        ],
    ),
    p.Embed(id=3, inputs=["a", "b", ""]),
    p.Tokenize(id=4, text="tokens", add_special=False),
    p.Tokenize(id=5, text=""),
    p.Cancel(id=6),
    p.Ping(seq=7),
    p.Shutdown(),
    p.Shutdown(grace=0.5),
    p.SetThreads(n_threads=3),
    p.SetCacheBudget(n_bytes=1 << 30),
    p.Generate(id=10, params=p.SamplingParams(timings_per_token=True), prompt_parts=[2, "text", 3]),
    p.Tokenize(id=11, text="x", parse_special=False, with_pieces=True),
    p.Detokenize(id=12, tokens=[2, 106, 0]),
    p.Render(id=13, messages=[p.ChatMessage(role="user", content="hi")]),
    p.SlotsQuery(id=14),
    p.SlotFile(id=16, slot=1, action="save", folder="/tmp/slots", filename="slot1.bin", folder_max_bytes=1 << 30, cache_scope="ab12", own_only=True),
]

FROM_WORKER: list[p.Frame] = [
    p.Loading(progress=0.0),
    p.Loading(progress=0.5),
    p.Ready(
        n_ctx=4096,
        n_ctx_slot=1024,
        slots=4,
        n_vocab=262144,
        n_ctx_train=32768,
        has_template=True,
        embeddings=False,
        n_embd=640,
        description="gemma3 270M Q4_K_M",
    ),
    p.Failed(message="could not load model"),
    p.Step(events=[]),
    p.Step(
        events=[
            p.TokenEvent(id=1, text="Hel", tokens=[10, 11]),
            p.TokenEvent(id=2, text="", tokens=[]),
            p.TokenEvent(
                id=3,
                text="end",
                tokens=[5],
                finish_reason="stop",
                usage=p.Usage(prompt_tokens=12, completion_tokens=4, cached_tokens=8),
            ),
            p.TokenEvent(
                id=4, finish_reason="length", usage=p.Usage(prompt_tokens=1, completion_tokens=2)
            ),
            p.TokenEvent(id=5, finish_reason="cancelled"),
        ]
    ),
    p.EmbedResult(id=3, data=[[0.25, -1.5, 0.0], []], prompt_tokens=9),
    p.TokenizeResult(id=4, tokens=[1, 2, 3]),
    p.TokenizeResult(id=5, tokens=[]),
    p.Error(id=8, code="context_length_exceeded", message="too long", param="messages"),
    p.Error(id=9, code="internal", message="boom"),
    p.Pong(seq=7),
    p.Pong(seq=8, active=3, queued=2),
    p.Occupancy(active=0, queued=0),
    p.Occupancy(active=4, queued=7),
    p.Ready(
        n_ctx=2048, n_ctx_slot=2048, slots=1, n_vocab=10, n_ctx_train=10, has_template=True,
        embeddings=False, n_embd=4, chat_template="{{ x }}", bos_token="<bos>", eos_token="<eos>",
        build_info="llama-cpp-python 0.3.36",
    ),
    p.Step(
        events=[
            p.TokenEvent(
                id=6, text="x", finish_reason="stop", stop_type="word", stopping_word="\n", id_slot=2,
                usage=p.Usage(prompt_tokens=3, completion_tokens=1),
                timings=p.Timings(prompt_n=3, prompt_ms=1.5, predicted_n=1, predicted_ms=2.0, cache_n=1),
            )
        ]
    ),
    p.TokenizeResult(id=11, tokens=[5, 6], pieces=["a", [195]]),
    p.DetokenizeResult(id=12, content="<bos>hi"),
    p.Rendered(id=13, prompt="<start_of_turn>user\nhi"),
    p.SlotsResult(
        id=14,
        slots=[
            p.SlotState(id=0, n_ctx=2048, is_processing=False),
            p.SlotState(id=1, n_ctx=2048, is_processing=True, id_task=3, n_decoded=4, n_remain=6, params=SAMPLING),
        ],
    ),
    p.Error(id=15, code="context_length_exceeded", message="too long", param="prompt", n_prompt_tokens=9000, n_ctx=2048),
    p.SlotFileResult(id=16, slot=1, n_tokens=84, n_bytes=4096, ms=1.5),
]


def test_every_frame_type_is_covered() -> None:
    """If a frame type is added to a union, it must be added to the lists above too."""
    to_types = set(p.ToWorker.__args__)  # type: ignore[attr-defined]
    from_types = set(p.FromWorker.__args__)  # type: ignore[attr-defined]
    assert {type(f) for f in TO_WORKER} == to_types
    assert {type(f) for f in FROM_WORKER} == from_types


def test_header_is_4_byte_big_endian_length() -> None:
    data = p.encode(p.Ping(seq=1))
    body = data[4:]
    assert int.from_bytes(data[:4], "big") == len(body)
    assert p.HEADER.size == 4


def test_frames_are_tagged_by_class_name() -> None:
    for f in TO_WORKER + FROM_WORKER:
        raw = msgspec.msgpack.decode(p.encode(f)[4:])
        assert raw["type"] == type(f).__name__


@pytest.mark.parametrize("frame", TO_WORKER, ids=lambda f: type(f).__name__)
def test_to_worker_round_trip(frame: p.Frame) -> None:
    fb = p.FrameBuffer()
    bodies = fb.feed(p.encode(frame))
    assert len(bodies) == 1
    assert p.decode_to_worker(bodies[0]) == frame


@pytest.mark.parametrize("frame", FROM_WORKER, ids=lambda f: type(f).__name__)
def test_from_worker_round_trip(frame: p.Frame) -> None:
    fb = p.FrameBuffer()
    bodies = fb.feed(p.encode(frame))
    assert len(bodies) == 1
    assert p.decode_from_worker(bodies[0]) == frame


def test_directions_do_not_mix() -> None:
    with pytest.raises(p.ProtocolError):
        p.decode_to_worker(p.encode(p.Pong(seq=1))[4:])
    with pytest.raises(p.ProtocolError):
        p.decode_from_worker(p.encode(p.Ping(seq=1))[4:])


def _stream(frames: list[p.Frame]) -> bytes:
    return b"".join(p.encode(f) for f in frames)


@pytest.mark.parametrize(
    ("frames", "decode"),
    [(TO_WORKER, p.decode_to_worker), (FROM_WORKER, p.decode_from_worker)],
    ids=["to_worker", "from_worker"],
)
def test_split_stream_at_every_offset(
    frames: list[p.Frame], decode: Callable[[bytes], p.Frame]
) -> None:
    data = _stream(frames)
    for cut in range(len(data) + 1):
        fb = p.FrameBuffer()
        bodies = fb.feed(data[:cut]) + fb.feed(data[cut:])
        assert [decode(b) for b in bodies] == frames, cut


@pytest.mark.parametrize(
    ("frames", "decode"),
    [(TO_WORKER, p.decode_to_worker), (FROM_WORKER, p.decode_from_worker)],
    ids=["to_worker", "from_worker"],
)
def test_split_stream_at_every_pair_of_offsets_per_frame(
    frames: list[p.Frame], decode: Callable[[bytes], p.Frame]
) -> None:
    # Two cuts inside each pair of consecutive frames exercise partial headers followed by
    # partial bodies.
    for a, b in itertools.pairwise(frames):
        data = _stream([a, b])
        for i in range(len(data) + 1):
            for j in range(i, len(data) + 1):
                fb = p.FrameBuffer()
                bodies = fb.feed(data[:i]) + fb.feed(data[i:j]) + fb.feed(data[j:])
                assert [decode(x) for x in bodies] == [a, b]


def test_byte_at_a_time() -> None:
    data = _stream(FROM_WORKER)
    fb = p.FrameBuffer()
    bodies: list[bytes] = []
    for i in range(len(data)):
        bodies += fb.feed(data[i : i + 1])
    assert [p.decode_from_worker(b) for b in bodies] == FROM_WORKER


def test_random_chunking() -> None:
    rng = random.Random(42)
    data = _stream(TO_WORKER) * 3
    for _ in range(50):
        fb = p.FrameBuffer()
        bodies: list[bytes] = []
        i = 0
        while i < len(data):
            n = rng.randint(0, 40)
            bodies += fb.feed(data[i : i + n])
            i += n
        assert [p.decode_to_worker(b) for b in bodies] == TO_WORKER * 3


def test_incomplete_frame_yields_nothing_until_complete() -> None:
    data = p.encode(p.Failed(message="x" * 100))
    fb = p.FrameBuffer()
    assert fb.feed(data[:2]) == []
    assert fb.feed(data[2:4]) == []
    assert fb.feed(data[4:-1]) == []
    assert len(fb.feed(data[-1:])) == 1
    assert fb.feed(b"") == []


def test_zero_length_body_is_a_frame() -> None:
    fb = p.FrameBuffer()
    assert fb.feed(b"\x00\x00\x00\x00") == [b""]
    with pytest.raises(p.ProtocolError):
        p.decode_from_worker(b"")


def test_oversized_frame_header_raises() -> None:
    fb = p.FrameBuffer()
    with pytest.raises(p.ProtocolError, match="exceeds"):
        fb.feed(p.HEADER.pack(p.MAX_FRAME_BYTES + 1))


def test_oversized_header_detected_without_body() -> None:
    fb = p.FrameBuffer()
    assert fb.feed(b"\xff\xff") == []
    with pytest.raises(p.ProtocolError):
        fb.feed(b"\xff\xff")


def test_oversized_header_after_valid_frame() -> None:
    fb = p.FrameBuffer()
    with pytest.raises(p.ProtocolError):
        fb.feed(p.encode(p.Ping(seq=1)) + b"\xff\xff\xff\xff")


def test_max_size_header_is_accepted_and_waits() -> None:
    fb = p.FrameBuffer()
    assert fb.feed(p.HEADER.pack(p.MAX_FRAME_BYTES) + b"abc") == []


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xc1",  # never-used msgpack opcode
        b"\x93\x01\x02",  # truncated array
        b"garbage that is not msgpack at all",
        msgspec.msgpack.encode([1, 2, 3]),
        msgspec.msgpack.encode("Ping"),
        msgspec.msgpack.encode({"seq": 1}),  # no tag
        msgspec.msgpack.encode({"type": "NoSuchFrame", "id": 1}),
        msgspec.msgpack.encode({"type": "Ping"}),  # missing field
        msgspec.msgpack.encode({"type": "Ping", "seq": "one"}),  # wrong type
    ],
)
def test_garbage_body_raises_protocol_error(body: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode_to_worker(body)
    with pytest.raises(p.ProtocolError):
        p.decode_from_worker(body)


def test_unknown_fields_rejected_to_worker() -> None:
    with pytest.raises(p.ProtocolError, match="unknown field"):
        p.decode_to_worker(msgspec.msgpack.encode({"type": "Ping", "seq": 1, "extra": 2}))


def test_unknown_fields_rejected_from_worker() -> None:
    with pytest.raises(p.ProtocolError, match="unknown field"):
        p.decode_from_worker(msgspec.msgpack.encode({"type": "Pong", "seq": 1, "extra": 2}))


def test_unknown_nested_fields_rejected() -> None:
    gen = {
        "type": "Generate",
        "id": 1,
        "params": {"temperature": 0.5, "mirostat": 2},
        "prompt": "x",
    }
    with pytest.raises(p.ProtocolError, match="mirostat"):
        p.decode_to_worker(msgspec.msgpack.encode(gen))
    step = {"type": "Step", "events": [{"id": 1, "text": "a", "logits": []}]}
    with pytest.raises(p.ProtocolError, match="logits"):
        p.decode_from_worker(msgspec.msgpack.encode(step))
    usage = {
        "type": "Step",
        "events": [{"id": 1, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total": 2}}],
    }
    with pytest.raises(p.ProtocolError, match="total"):
        p.decode_from_worker(msgspec.msgpack.encode(usage))
    msg = {"type": "Generate", "id": 1, "params": {}, "messages": [{"role": "user", "audio": "x"}]}
    with pytest.raises(p.ProtocolError, match="audio"):
        p.decode_to_worker(msgspec.msgpack.encode(msg))


def test_bad_literal_values_rejected() -> None:
    step = {"type": "Step", "events": [{"id": 1, "finish_reason": "tool_calls"}]}
    with pytest.raises(p.ProtocolError):
        p.decode_from_worker(msgspec.msgpack.encode(step))
    err = {"type": "Error", "id": 1, "code": "teapot", "message": "x"}
    with pytest.raises(p.ProtocolError):
        p.decode_from_worker(msgspec.msgpack.encode(err))


def test_defaults_are_omitted_on_the_wire() -> None:
    raw = msgspec.msgpack.decode(
        p.encode(p.Generate(id=1, params=p.SamplingParams(), prompt="x"))[4:]
    )
    assert raw == {"type": "Generate", "id": 1, "params": {}, "prompt": "x"}


def test_worker_spec_json_round_trip() -> None:
    spec = p.WorkerSpec(name="m", path="/models/m.gguf", slots=2, chat_template="gemma", threads=4)
    data = msgspec.json.encode(spec)
    assert msgspec.json.decode(data, type=p.WorkerSpec) == spec
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"name":"m","path":"p","bogus":1}', type=p.WorkerSpec)
