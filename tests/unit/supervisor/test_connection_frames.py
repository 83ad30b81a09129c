"""What the router sends a worker (supervisor/connection.py): a structured-output
constraint carries the client's own schema (`Constraint.given`) for upstreams that
enforce it themselves, and that copy never goes into a Generate frame: a worker needs
only the narrowed schema, and a schema twice would double the frame."""

from __future__ import annotations

import json

import pytest
import trio.testing

from router.generation.structured import constraint
from supervisor.connection import WorkerConnection
from worker.protocol import ChatMessage, Generate, SamplingParams
from worker.protocol.framing import FrameBuffer, decode_to_worker


@pytest.mark.trio
async def test_a_generate_frame_carries_the_narrowed_schema_only() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    c = constraint([(schema, "response_format")])
    assert c is not None and c.given is not None and json.loads(c.given) == schema
    assert json.loads(c.source) != schema  # narrowed: integers bounded, objects closed
    ours, _theirs = trio.testing.memory_stream_pair()
    conn = WorkerConnection("m", ours, lambda: None)
    conn.generate(SamplingParams(constraint=c), messages=[ChatMessage(role="user", content="x")])
    (body,) = FrameBuffer().feed(conn._out_recv.receive_nowait())  # what the writer task writes
    assert b'"given"' not in bytes(body)
    frame = decode_to_worker(body)
    assert isinstance(frame, Generate) and frame.params.constraint is not None
    assert (frame.params.constraint.source, frame.params.constraint.given) == (c.source, None)
