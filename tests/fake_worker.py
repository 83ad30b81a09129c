"""A fake worker: speaks the real wire protocol (worker/protocol/) without loading a model.

Run as the supervisor runs a worker:

    python tests/fake_worker.py --fd N --spec JSON      (or: python -m tests.fake_worker ...)

It imports only the standard library, msgspec, worker.protocol, worker.priority (pure) and
tests.behaviour, and uses
plain blocking sockets and threads, so it starts in a fraction of a second and costs no CPU
while idle.

What it does
------------
* Sends Loading(0.0), waits FAKE_LOAD_DELAY seconds, sends Loading(1.0) then Ready, whose
  fields come from the spec: n_ctx = n_ctx_slot = spec.n_ctx, slots = spec.slots,
  embeddings = spec.embeddings, n_vocab = 32000, n_ctx_train = 32768, n_embd = 16,
  has_template = True.
* SetThreads(n) -> later Pongs report threads = n (before: 0 while loading, then
  spec.threads or the CPU count).
* Occupancy(active, queued) whenever either count changes, as the real engine sends it.
* Ping -> Pong(seq, active, queued, threads), answered by the reader thread at any time (also while
  "loading"). Frames other than Ping/Shutdown that arrive before Ready wait for Ready.
* Generate: at most `spec.slots` requests run at once, the rest queue by class
  (Generate.priority), and a better class takes a worse one's slot as the real engine
  does (worker/priority.py: the displaced request waits at the front of its class). Every step (one Step
  frame for all running requests, FAKE_TOKENS_PER_SEC steps per second) each running
  request gains one word: "tok0", " tok1", " tok2", ... (token id 1000 + n). The request ends
  after max_tokens words (8 when max_tokens is None; 0 ends at once) with finish_reason
  "length"; the final event carries the last word and Usage(prompt_tokens,
  completion_tokens); a choice's first event that is not its final one carries
  prompt_usage (its prompt's tokens), as the real worker's does. The prompt (or the
  messages' contents joined by newlines) counts one token per whitespace-separated word
  plus one BOS token; a prompt of n_ctx_slot tokens or more is rejected with
  Error(code="context_length_exceeded").
  Stop strings are honoured crudely: after each word, if the text generated so far contains
  a stop string, the request ends with finish_reason "stop" and the text before the stop
  string; nothing is held back, so a stop string that spans words may already have been
  partly sent.
  Generate on an embeddings model -> Error(code="unsupported", param="model").
  A Generate with n > 1 runs n requests under its id, events saying their `index`; a token
  prompt (prompt_tokens) counts its ids; with `echo`, each choice's first event carries
  the prompt text (token prompts: the ids joined by spaces). No logprobs.
* Cancel(id): the request (every choice of it) leaves its slot (or the queue) and gets a final event with
  finish_reason "cancelled". Unknown ids are ignored.
* Embed: one deterministic unit vector of 16 floats per input (from sha256 of the text);
  prompt_tokens counts as above. Embed on a non-embeddings model -> Error("unsupported");
  an empty input -> Error("invalid_request", param="input").
* Tokenize: [1 if add_special] + one id per word (crc32 of the word mod n_vocab); with
  with_pieces, each word is its piece. Detokenize, Render and SlotsQuery are answered as
  tests/fake_answers.py says; a Generate with prompt_parts counts an id as one token, and
  an id outside the vocabulary is Error(invalid_request, param="prompt"). A final event
  carries stop_type ("limit", or "word" with the stop string), timings and id_slot 0.
  SlotsQuery shows each busy slot's request: its id (id_task), tokens so far, parameters.
* Shutdown(grace): new Generates get Error("unavailable", "the model's worker is shutting down"); running
  requests may finish for up to `grace` seconds, then the rest are cancelled; exit code 0.
  Before Ready, Shutdown exits 0 at once.
* EOF on the socket: exit 0 at once (orphan protection, like the real worker). A write to a
  closed socket also exits 0. A frame that does not decode: exit 2.

Behaviour flags (environment variables)
---------------------------------------
tests/behaviour.py defines them once, for this worker and the in-process sim
(Behaviour.from_env reads them here). In short: FAKE_<FLAG>, overridden per model by
FAKE_<FLAG>__<name> (<name> with every character outside [A-Za-z0-9] replaced by "_");
an empty value means "unset", so FAKE_CRASH_AFTER__other= turns a global FAKE_CRASH_AFTER
off for the model "other"; booleans are true unless empty, "0", "false", "no" or "off".

  FAKE_START_LOG=<path>     append "<model name> <pid>\\n" to <path> on every start (before
                            any other flag acts, so FAKE_EXIT_AT_START starts are counted)
  FAKE_EXIT_AT_START=1      exit with code 3 at once, without sending any frame
  FAKE_LOAD_DELAY=<s>       seconds between Loading(0.0) and Ready (default 0)
  FAKE_ALLOC_MB=<n>         hold n MiB of resident memory from load on (default 0)
  FAKE_FAIL_LOAD=<message>  send Failed(message) instead of Ready and exit 1; the values
                            1/true/yes send "fake load failure"
  FAKE_TOKENS_PER_SEC=<r>   decode steps per second (default 200)
  FAKE_CRASH_AFTER=<n>      os._exit(1) when about to produce token n+1, counting every
                            token this process has produced for any request
  FAKE_HANG=1               after Ready, never read or answer anything again (not even Ping,
                            Shutdown or EOF); the process still exits by itself after 60 s
                            so a broken test cannot leak it for long
  FAKE_IGNORE_SHUTDOWN=1    ignore Shutdown frames (to exercise SIGTERM/SIGKILL escalation)
  FAKE_IGNORE_SIGTERM=1     ignore SIGTERM (only SIGKILL stops it)

The flags are read once, at start; a malformed number stops the worker there (a traceback
and exit code 1).

SIGINT is always ignored, like the real worker.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import queue
import signal
import socket
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

# `python tests/fake_worker.py` puts tests/ first on sys.path; make sure the worker package
# of this checkout is the one imported.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import msgspec  # noqa: E402

from tests import fake_answers  # noqa: E402
from tests.behaviour import Behaviour  # noqa: E402
from worker.priority import Running, insert_at, to_make_way  # noqa: E402
from worker.protocol import (  # noqa: E402
    Cancel,
    Detokenize,
    Embed,
    EmbedResult,
    Error,
    Failed,
    Frame,
    FrameBuffer,
    Generate,
    Loading,
    Occupancy,
    Ping,
    Pong,
    ProtocolError,
    Ready,
    Render,
    SamplingParams,
    SetCacheBudget,
    SetThreads,
    Shutdown,
    SlotsQuery,
    SlotsResult,
    SlotState,
    Step,
    TokenEvent,
    Tokenize,
    Usage,
    WorkerSpec,
    decode_to_worker,
    encode,
)

N_VOCAB = 32000
N_EMBD = 16
N_CTX_TRAIN = 32768
HANG_LIMIT_S = 60.0


# ---- the socket -----------------------------------------------------------------------------


class Out:
    """Writes frames; many threads share it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()

    def send(self, frame: Frame) -> None:
        data = encode(frame)
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                os._exit(0)  # the supervisor is gone


# ---- fake model -----------------------------------------------------------------------------


def words(text: str) -> list[str]:
    return text.split()


def tokenize(text: str, add_special: bool = True) -> list[int]:
    ids = [zlib.crc32(w.encode()) % N_VOCAB for w in words(text)]
    return ([1] if add_special else []) + ids


def embed_vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()  # 32 bytes -> 16 uint16
    raw = [(v / 32767.5) - 1.0 for v in struct.unpack(">16H", digest)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


@dataclass(eq=False)
class Request:
    id: int
    prompt_tokens: int
    max_tokens: int
    stop: list[str]
    timings_per_token: bool = False
    n_gen: int = 0
    text: str = ""  # everything generated
    sent: int = 0  # how much of `text` has been sent
    finished: bool = field(default=False)
    index: int = 0  # the choice, of a Generate with n > 1
    echo: str | None = None  # the prompt text, for the choice's first event
    params: SamplingParams | None = None  # as sent, for SlotsQuery
    rank: int = 1  # Generate.priority
    admitted: float = 0.0  # when it last took a slot


class Engine:
    def __init__(self, spec: WorkerSpec, behaviour: Behaviour, out: Out) -> None:
        self.spec = spec
        self.out = out
        self.inbox: queue.Queue[Frame] = queue.Queue()
        self.active: list[Request] = []
        self.waiting: list[Request] = []
        self.interval = 1.0 / max(behaviour.tokens_per_sec, 1e-6)
        self.crash_after = behaviour.crash_after
        self.total_tokens = 0
        self.draining = False
        self.drain_deadline = math.inf
        self.threads = spec.threads or len(os.sched_getaffinity(0))
        self.reported = (0, 0)  # the counts of the last Occupancy frame

    # ---- commands (engine thread) ---------------------------------------------------------

    def handle(self, frame: Frame) -> None:
        if isinstance(frame, Generate):
            self.generate(frame)
        elif isinstance(frame, Cancel) and frame.index is None:
            self.cancel(frame.id)
        elif isinstance(frame, Embed):
            self.embed(frame)
        elif isinstance(frame, Tokenize):
            self.out.send(fake_answers.tokenize_result(frame.id, frame.text, frame.add_special, frame.with_pieces))
        elif isinstance(frame, Detokenize):
            self.out.send(fake_answers.detokenize(frame.id, frame.tokens))
        elif isinstance(frame, Render):
            self.out.send(fake_answers.render(frame.id, frame.messages))
        elif isinstance(frame, Shutdown):
            self.draining = True
            self.drain_deadline = time.monotonic() + max(frame.grace, 0.0)

    def generate(self, g: Generate) -> None:
        if self.draining:
            self.out.send(Error(id=g.id, code="unavailable", message="the model's worker is shutting down"))
            return
        if self.spec.embeddings:
            self.out.send(
                Error(
                    id=g.id,
                    code="unsupported",
                    message="this model serves embeddings only (embeddings = true)",
                    param="model",
                )
            )
            return
        param = "messages" if g.messages is not None else "prompt"
        if g.prompt_parts is not None and (err := fake_answers.bad_id(g.id, g.prompt_parts, "prompt")):
            self.out.send(err)
            return
        n_prompt = fake_answers.prompt_tokens(g)
        text = fake_answers.prompt_text(g)
        if n_prompt >= self.spec.n_ctx:
            self.out.send(
                Error(
                    id=g.id,
                    code="context_length_exceeded",
                    message=f"the prompt has {n_prompt} tokens; the context holds "
                    f"{self.spec.n_ctx}",
                    param=param,
                    n_prompt_tokens=n_prompt,
                    n_ctx=self.spec.n_ctx,
                )
            )
            return
        max_tokens = 8 if g.params.max_tokens is None else g.params.max_tokens
        reqs = [
            Request(
                g.id, n_prompt, max_tokens, list(g.params.stop), g.params.timings_per_token,
                index=i, echo=text if g.echo else None, params=g.params, rank=g.priority,
            )
            for i in range(max(g.n, 1))
        ]
        if max_tokens <= 0:
            self.out.send(Step(events=[self.final(req, "length") for req in reqs]))
            return
        at = insert_at([w.rank for w in self.waiting], g.priority, front=False)
        self.waiting[at:at] = reqs

    def cancel(self, rid: int) -> None:
        for group in (self.active, self.waiting):
            for req in list(group):
                if req.id == rid:
                    group.remove(req)
                    self.out.send(Step(events=[self.final(req, "cancelled")]))

    def embed(self, e: Embed) -> None:
        if not self.spec.embeddings:
            self.out.send(
                Error(
                    id=e.id,
                    code="unsupported",
                    message="this model does not serve embeddings (set embeddings = true)",
                    param="model",
                )
            )
            return
        inputs = [" ".join(map(str, t)) for t in e.tokens] if e.tokens is not None else e.inputs
        for i, text in enumerate(inputs):
            if not text:
                message = f"input[{i}] is empty"
                error = Error(id=e.id, code="invalid_request", message=message, param="input")
                self.out.send(error)
                return
        self.out.send(
            EmbedResult(
                id=e.id,
                data=[embed_vector(t) for t in inputs],
                prompt_tokens=sum(len(tokenize(t)) for t in inputs),
            )
        )

    # ---- decoding -------------------------------------------------------------------------

    def final(
        self, req: Request, reason: str, text: str = "", tokens: list[int] | None = None, word: str = ""
    ) -> TokenEvent:
        req.finished = True
        echo, req.echo = req.echo, None
        return TokenEvent(
            id=req.id,
            text=text,
            tokens=tokens or [],
            finish_reason=reason,  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=req.prompt_tokens, completion_tokens=req.n_gen),
            stop_type="word" if word else ("limit" if reason == "length" else None),
            stopping_word=word,
            timings=fake_answers.timings(req.prompt_tokens, req.n_gen, self.interval),
            id_slot=0,
            index=req.index,
            echo=echo,
        )

    def step(self) -> None:
        events: list[TokenEvent] = []
        for req in list(self.active):
            if self.crash_after is not None and self.total_tokens >= self.crash_after:
                os._exit(1)
            n = req.n_gen
            word = f"tok{n}" if n == 0 else f" tok{n}"
            tokens = [1000 + n]
            req.n_gen += 1
            self.total_tokens += 1
            req.text += word
            hits = [(i, s) for s in req.stop if s and (i := req.text.find(s)) >= 0]
            if hits:
                hit, word = min(hits)
                piece = req.text[req.sent : max(hit, req.sent)]
                req.sent = len(req.text)
                events.append(self.final(req, "stop", piece, tokens, word))
            elif req.n_gen >= req.max_tokens:
                piece, req.sent = req.text[req.sent :], len(req.text)
                events.append(self.final(req, "length", piece, tokens))
            else:
                piece, req.sent = req.text[req.sent :], len(req.text)
                t = fake_answers.timings(req.prompt_tokens, req.n_gen, self.interval) if req.timings_per_token else None
                echo, req.echo = req.echo, None
                # As the real worker does: a choice's first event says its prompt's tokens.
                first = Usage(prompt_tokens=req.prompt_tokens, completion_tokens=0) if n == 0 else None
                events.append(TokenEvent(id=req.id, text=piece, tokens=tokens, timings=t, index=req.index, echo=echo,
                                         prompt_usage=first))
            if req.finished:
                self.active.remove(req)
        if events:
            self.out.send(Step(events=events))

    def run(self) -> None:
        while True:
            idle = not self.active and not self.waiting
            if idle and self.draining:
                os._exit(0)
            try:
                frame = self.inbox.get(block=idle, timeout=None)
                while True:
                    self.handle(frame)
                    frame = self.inbox.get_nowait()
            except queue.Empty:
                pass
            if self.draining and time.monotonic() >= self.drain_deadline:
                for req in self.active + self.waiting:
                    self.out.send(Step(events=[self.final(req, "cancelled")]))
                os._exit(0)
            self.make_way()
            while self.waiting and len(self.active) < self.spec.slots:
                req = self.waiting.pop(0)
                req.admitted = time.monotonic()
                self.active.append(req)
            if self.active:
                self.step()
            self.report_occupancy()
            if self.active:
                time.sleep(self.interval)

    def make_way(self) -> None:
        """As the real engine (worker/priority.py): a waiting request of a better class
        takes a worse one's slot, which goes back to the front of its class."""
        running: list[Running | None] = [Running(r.rank, r.admitted, True) for r in self.active]
        running += [None] * (self.spec.slots - len(running))
        for i in sorted(to_make_way([w.rank for w in self.waiting], running), reverse=True):
            req = self.active.pop(i)
            self.waiting.insert(insert_at([w.rank for w in self.waiting], req.rank, front=True), req)

    def report_occupancy(self) -> None:
        """As the real engine: an Occupancy frame whenever the counts change."""
        counts = (len(self.active), len(self.waiting))
        if counts != self.reported:
            self.reported = counts
            self.out.send(Occupancy(active=counts[0], queued=counts[1]))


# ---- main -----------------------------------------------------------------------------------


def reader(
    sock: socket.socket, out: Out, engine: Engine, ignore_shutdown: bool, state: dict[str, bool]
) -> None:
    frames = FrameBuffer()
    while True:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        if state["hung"]:
            threading.Event().wait()  # never answers again; main() exits after HANG_LIMIT_S
        if not data:
            os._exit(0)  # EOF: the supervisor is gone
        try:
            bodies = frames.feed(data)
            for body in bodies:
                frame = decode_to_worker(body)
                if isinstance(frame, Ping):
                    active, queued = len(engine.active), len(engine.waiting)
                    threads = engine.threads if state["ready"] else 0  # like the real one: 0 while loading
                    out.send(Pong(seq=frame.seq, active=active, queued=queued, threads=threads))
                elif isinstance(frame, SetThreads):
                    engine.threads = frame.n_threads
                elif isinstance(frame, SetCacheBudget):
                    pass  # it saves no prompts
                elif isinstance(frame, SlotsQuery):
                    # Answered here, as the real worker's reader does; a racy read is fine.
                    busy = {i: r for i, r in enumerate(list(engine.active))}
                    slots = [
                        SlotState(
                            id=i, n_ctx=engine.spec.n_ctx, is_processing=i in busy,
                            id_task=busy[i].id if i in busy else -1,
                            n_decoded=busy[i].n_gen if i in busy else 0,
                            params=busy[i].params if i in busy else None,
                        )
                        for i in range(engine.spec.slots)
                    ]
                    out.send(SlotsResult(id=frame.id, slots=slots))
                elif isinstance(frame, Shutdown):
                    if ignore_shutdown:
                        continue
                    if not state["ready"]:
                        os._exit(0)
                    engine.inbox.put(frame)
                else:
                    engine.inbox.put(frame)
        except ProtocolError as exc:
            print(f"fake_worker: protocol error: {exc}", file=sys.stderr)
            os._exit(2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fake_worker")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    spec = msgspec.json.decode(args.spec, type=WorkerSpec)
    behaviour = Behaviour.from_env(spec.name)

    if behaviour.start_log is not None:
        with open(behaviour.start_log, "a", encoding="utf-8") as f:
            f.write(f"{spec.name} {os.getpid()}\n")
    if behaviour.exit_at_start:
        os._exit(3)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if behaviour.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    sock = socket.socket(fileno=args.fd)
    sock.setblocking(True)
    out = Out(sock)
    engine = Engine(spec, behaviour, out)
    state = {"ready": False, "hung": False}
    reader_args = (sock, out, engine, behaviour.ignore_shutdown, state)
    threading.Thread(target=reader, args=reader_args, daemon=True).start()

    out.send(Loading(progress=0.0))
    # Resident memory, as a model's weights would be: written, so every page is counted.
    ballast = b"\x01" * int(behaviour.alloc_mb * 1024 * 1024)  # noqa: F841
    time.sleep(behaviour.load_delay)
    if behaviour.fail_load is not None:
        out.send(Failed(message=behaviour.fail_load))
        os._exit(1)
    out.send(Loading(progress=1.0))
    state["hung"] = behaviour.hang
    state["ready"] = True
    out.send(
        Ready(
            n_ctx=spec.n_ctx,
            n_ctx_slot=spec.n_ctx,
            slots=spec.slots,
            n_vocab=N_VOCAB,
            n_ctx_train=N_CTX_TRAIN,
            has_template=True,
            embeddings=spec.embeddings,
            n_embd=N_EMBD,
            description=f"fake worker for {spec.name}",
            # A model that takes tools when its config says how ("auto" reads a template
            # the fake has not got).
            tool_format=None if spec.tool_format == "auto" else spec.tool_format,
        )
    )
    if behaviour.hang:
        time.sleep(HANG_LIMIT_S)
        os._exit(0)
    engine.run()
    return 0


if __name__ == "__main__":
    main()
    os._exit(0)
