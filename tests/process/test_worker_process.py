"""Worker processes on their own: orphan protection, and the fake worker's own contract.

The fake worker stands in for the real one in every process test, so it is checked here
against the protocol directly, over a plain socketpair, with no supervisor involved.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time

import msgspec
import pytest
import trio

from supervisor.launcher import open_worker
from tests.harness import write_gguf
from tests.process.support import FAKE_WORKER, WORKER_COMMAND, StartLog, alive, expected_text
from worker.protocol import (
    Cancel,
    Embed,
    EmbedResult,
    Error,
    Failed,
    FrameBuffer,
    Generate,
    Loading,
    Occupancy,
    Ping,
    Pong,
    Ready,
    SamplingParams,
    SetThreads,
    Shutdown,
    Step,
    TokenEvent,
    Tokenize,
    TokenizeResult,
    WorkerSpec,
    decode_from_worker,
    encode,
)

# ---- orphan protection ----------------------------------------------------------------------


async def test_worker_exits_when_the_supervisor_end_of_the_socket_closes(
    tmp_path, start_log: StartLog
) -> None:
    spec = WorkerSpec(name="orphan", path=str(tmp_path / "dummy.gguf"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            conn = await open_worker(nursery, spec, WORKER_COMMAND, lambda: None)
            proc = conn.process
            assert proc is not None and proc.returncode is None
            assert conn.ready is not None and conn.ready.slots == spec.slots
            await conn._stream.aclose()  # what the kernel does when the supervisor dies
            with trio.fail_after(3):
                code = await proc.wait()
            assert code == 0  # it left by itself on EOF; a kill would read -9
            await trio.sleep(0.1)
            assert conn.closed.is_set()
            nursery.cancel_scope.cancel()
    assert start_log.pids() == [proc.pid]


_HOST = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import trio

    from supervisor.config import parse
    from supervisor.supervisor import Supervisor

    async def main():
        cfg = parse(sys.argv[1], Path(sys.argv[2]))
        sup = Supervisor(cfg, worker_command=[sys.executable, sys.argv[3]])
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            lease = await sup.resolve("chat").acquire()
            print(lease.conn.process.pid, flush=True)
            await trio.sleep_forever()

    trio.run(main)
    """
)


def test_worker_exits_when_its_supervisor_is_killed(tmp_path, start_log: StartLog) -> None:
    write_gguf(tmp_path / "dummy.gguf")
    config = '[models.chat]\npath = "dummy.gguf"\n'
    host = subprocess.Popen(
        [sys.executable, "-c", _HOST, config, str(tmp_path), str(FAKE_WORKER)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None
        ready, _, _ = select.select([host.stdout], [], [], 20)
        assert ready, "the supervisor process did not report its worker in time"
        line = host.stdout.readline()
        worker_pid = int(line)
        assert start_log.pids() == [worker_pid]
        assert alive(worker_pid)
        os.kill(host.pid, signal.SIGKILL)  # no cleanup code runs in the supervisor
        host.wait(5)
        deadline = time.monotonic() + 3
        while alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(worker_pid), "the worker outlived its supervisor"
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()


# ---- the fake worker itself -----------------------------------------------------------------


class Client:
    """A blocking protocol client on our end of a socketpair."""

    def __init__(self, spec: WorkerSpec, env: dict[str, str] | None = None) -> None:
        ours, theirs = socket.socketpair()
        fd = theirs.fileno()
        argv = [*WORKER_COMMAND, "--fd", str(fd), "--spec", msgspec.json.encode(spec).decode()]
        self.proc = subprocess.Popen(argv, pass_fds=(fd,), env={**os.environ, **(env or {})})
        theirs.close()
        self.sock = ours
        self.sock.settimeout(5)
        self.frames = FrameBuffer()
        self.backlog: list[object] = []
        # Occupancy frames come whenever the slot counts change, between any two answers;
        # they are kept here, in order, for the tests that look at them.
        self.occupancy: list[Occupancy] = []

    def send(self, frame: object) -> None:
        self.sock.sendall(encode(frame))  # type: ignore[arg-type]

    def recv(self, timeout: float = 5) -> object:
        """The next frame other than Occupancy; raises socket.timeout if none comes in time,
        EOFError on EOF."""
        self.sock.settimeout(timeout)
        while True:
            while not self.backlog:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise EOFError
                self.backlog += [decode_from_worker(b) for b in self.frames.feed(data)]
            frame = self.backlog.pop(0)
            if not isinstance(frame, Occupancy):
                return frame
            self.occupancy.append(frame)

    def until_ready(self) -> tuple[list[object], Ready]:
        before = []
        while not isinstance(frame := self.recv(), Ready):
            before.append(frame)
        return before, frame

    def events(self, rid: int) -> list[TokenEvent]:
        """Every event of request `rid` up to its final one (other requests' are dropped)."""
        out: list[TokenEvent] = []
        while not out or out[-1].finish_reason is None:
            frame = self.recv()
            if isinstance(frame, Step):
                out += [ev for ev in frame.events if ev.id == rid]
        return out

    def close(self) -> int:
        self.sock.close()
        try:
            return self.proc.wait(5)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def client_factory():
    clients: list[Client] = []

    def make(spec: WorkerSpec, env: dict[str, str] | None = None) -> Client:
        c = Client(spec, env)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


def test_fake_worker_speaks_the_protocol(client_factory, start_log: StartLog) -> None:
    spec = WorkerSpec(name="m", path="/dummy", slots=2, n_ctx=64)
    # A ping sent while it loads is answered before Ready. With no load delay the answer
    # raced Ready and came after it (a CI run failed on that), so the load takes a second here
    # and the ping goes out once loading has begun.
    c = client_factory(spec, {"FAKE_LOAD_DELAY": "1"})
    assert c.recv() == Loading(progress=0.0)
    c.send(Ping(seq=1))
    before, ready = c.until_ready()
    assert before[0] == Pong(seq=1)
    assert [f for f in before if isinstance(f, Loading)][-1] == Loading(progress=1.0)
    assert (ready.n_ctx, ready.n_ctx_slot, ready.slots, ready.embeddings) == (64, 64, 2, False)
    assert start_log.entries() == [("m", c.proc.pid)]

    c.send(Generate(id=1, params=SamplingParams(max_tokens=4), prompt="one two three"))
    events = c.events(1)
    assert "".join(ev.text for ev in events) == expected_text(4)
    assert [ev.tokens for ev in events] == [[1000], [1001], [1002], [1003]]
    assert events[-1].finish_reason == "length"
    assert events[-1].usage is not None
    assert (events[-1].usage.prompt_tokens, events[-1].usage.completion_tokens) == (4, 4)

    c.send(Generate(id=2, params=SamplingParams(), prompt="x"))  # max_tokens None: 8
    assert "".join(ev.text for ev in c.events(2)) == expected_text(8)

    c.send(Generate(id=3, params=SamplingParams(max_tokens=50, stop=[" tok3"]), prompt="x"))
    events = c.events(3)
    assert "".join(ev.text for ev in events) == expected_text(3)
    assert events[-1].finish_reason == "stop"
    # each request took a slot and gave it back; the counts are reported on every change
    c.send(Ping(seq=100))
    assert c.recv() == Pong(seq=100, active=0, queued=0, threads=len(os.sched_getaffinity(0)))
    # The last Occupancy frame comes from the engine's loop, the Pong from the link's
    # thread: on a loaded machine the Pong can pass it (seen in a fresh-clone run).
    for seq in range(101, 121):
        if len(c.occupancy) >= 6:
            break
        c.send(Ping(seq=seq))
        assert isinstance(c.recv(), Pong)
    assert c.occupancy == [Occupancy(active=1, queued=0), Occupancy(active=0, queued=0)] * 3

    c.send(Generate(id=4, params=SamplingParams(max_tokens=5), prompt="word " * 64))
    err = c.recv()
    assert isinstance(err, Error) and err.id == 4
    assert (err.code, err.param) == ("context_length_exceeded", "prompt")

    c.send(Tokenize(id=5, text="a b", add_special=False))
    toks = c.recv()
    assert isinstance(toks, TokenizeResult) and toks.id == 5 and len(toks.tokens) == 2

    c.send(Embed(id=6, inputs=["x"]))
    err = c.recv()
    assert isinstance(err, Error) and err.code == "unsupported"

    c.send(Ping(seq=7))
    assert c.recv() == Pong(seq=7, active=0, queued=0, threads=len(os.sched_getaffinity(0)))
    c.send(SetThreads(n_threads=1))
    c.send(Ping(seq=8))
    assert c.recv() == Pong(seq=8, active=0, queued=0, threads=1)


def test_fake_worker_cancel_and_shutdown(client_factory) -> None:
    c = client_factory(WorkerSpec(name="m", path="/dummy", slots=1), {"FAKE_TOKENS_PER_SEC": "50"})
    c.until_ready()
    c.send(Generate(id=1, params=SamplingParams(max_tokens=10_000), prompt="x"))
    c.send(Generate(id=2, params=SamplingParams(max_tokens=10_000), prompt="x"))  # queued
    first = c.recv()
    assert isinstance(first, Step) and first.events[0].id == 1
    counts = []
    for seq in range(50):  # the engine adopts request 2 at its next step
        c.send(Ping(seq=seq))
        while not isinstance(pong := c.recv(), Pong):
            pass
        counts.append((pong.active, pong.queued))
        if counts[-1] == (1, 1):
            break
        time.sleep(0.02)
    assert counts[-1] == (1, 1), counts
    c.send(Cancel(id=2))
    c.send(Cancel(id=1))
    reasons = {}
    while len(reasons) < 2:
        frame = c.recv()
        if isinstance(frame, Step):
            reasons.update({ev.id: ev.finish_reason for ev in frame.events if ev.finish_reason})
    assert reasons == {1: "cancelled", 2: "cancelled"}

    # Shutdown lets the running request finish within the grace, refuses new ones, exits 0.
    c.send(Generate(id=3, params=SamplingParams(max_tokens=5), prompt="x"))
    c.send(Shutdown(grace=5))
    c.send(Generate(id=4, params=SamplingParams(max_tokens=5), prompt="x"))
    frames = []
    with pytest.raises(EOFError):
        while True:
            frames.append(c.recv())
    steps = [f for f in frames if isinstance(f, Step)]
    finals = {ev.id: ev.finish_reason for f in steps for ev in f.events if ev.finish_reason}
    assert finals == {3: "length"}
    assert [f.code for f in frames if isinstance(f, Error) and f.id == 4] == ["unavailable"]
    assert c.proc.wait(5) == 0


def test_fake_worker_embeddings_and_per_model_flags(client_factory, start_log: StartLog) -> None:
    env = {"FAKE_EXIT_AT_START": "1", "FAKE_EXIT_AT_START__emb_1": ""}  # per-model override wins
    c = client_factory(WorkerSpec(name="emb-1", path="/dummy", embeddings=True), env)
    _, ready = c.until_ready()
    assert ready.embeddings is True
    c.send(Embed(id=1, inputs=["a", "b", "a"]))
    res = c.recv()
    assert isinstance(res, EmbedResult) and res.id == 1
    assert len(res.data) == 3 and all(len(v) == ready.n_embd for v in res.data)
    assert res.data[0] == res.data[2] != res.data[1]
    assert abs(sum(x * x for x in res.data[0]) - 1.0) < 1e-6
    c.send(Generate(id=2, params=SamplingParams(max_tokens=1), prompt="x"))
    err = c.recv()
    assert isinstance(err, Error) and err.code == "unsupported"

    other = client_factory(WorkerSpec(name="other", path="/dummy"), env)
    with pytest.raises(EOFError):
        other.recv()
    assert other.proc.wait(5) == 3
    assert start_log.names() == ["emb-1", "other"]


def test_fake_worker_hang_and_fail_load(client_factory) -> None:
    hung = client_factory(WorkerSpec(name="h", path="/dummy"), {"FAKE_HANG": "1"})
    hung.until_ready()
    hung.send(Ping(seq=1))
    with pytest.raises(socket.timeout):
        hung.recv(timeout=0.5)
    hung.proc.terminate()
    assert hung.proc.wait(5) == -signal.SIGTERM

    bad = client_factory(WorkerSpec(name="b", path="/dummy"), {"FAKE_FAIL_LOAD": "no such tensor"})
    frames = []
    with pytest.raises(EOFError):
        while True:
            frames.append(bad.recv())
    assert frames[-1] == Failed(message="no such tensor")
    assert not any(isinstance(f, Ready) for f in frames)
    assert bad.proc.wait(5) == 1
