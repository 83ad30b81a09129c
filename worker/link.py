"""The worker's trio side: reads frames from the supervisor's socket, writes the engine's.

Three tasks share one socket: a reader that forwards commands to the engine's queue (and
answers pings itself, so a ping measures the event loop, not the decode step), a writer that
drains the outgoing channel, and the engine thread. The engine hands frames over with
`run_sync_soon`, which never blocks it.

The worker exits as soon as its socket reaches EOF: it can never outlive its supervisor,
even one killed with `kill -9`.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import trio

from worker import draft_model, vocab_pieces
from worker.constraint import tokenizer_for
from worker.engine import Engine
from worker.model import LoadedModel
from worker.preparer import Work
from worker.prompt_cache import CacheOptions
from worker.prompt_store import fingerprint
from worker.protocol.load_options import CELL_OPTIONS
from worker.request import slot_states
from worker.protocol import (
    Cancel,
    SlotFile,
    Error,
    Frame,
    FrameBuffer,
    Failed,
    Generate,
    Loading,
    Ping,
    Pong,
    ProtocolError,
    Ready,
    SetCacheBudget,
    SetThreads,
    Shutdown,
    SlotsQuery,
    SlotsResult,
    ToWorker,
    WorkerSpec,
    decode_to_worker,
    encode,
)

if TYPE_CHECKING:
    from llguidance import LLTokenizer

    from worker.media.projector import Projector

log = logging.getLogger("worker")

# What a clean stop may spend writing saved prompts to disk; the supervisor waits this much
# longer for a worker to exit (supervisor/launcher.py).
PERSIST_SECONDS = 10.0


class Link:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._send, self._recv = trio.open_memory_channel[bytes](math.inf)
        self._token = trio.lowlevel.current_trio_token()
        self.engine: Engine | None = None
        # Frames that arrive while the model loads wait here; the engine adopts the queue.
        self.early: list[Work | Cancel | SetThreads | SetCacheBudget | SlotFile] = []
        self.draining = False

    def emit(self, frame: Frame) -> None:
        """Queue a frame for the writer. Safe from any thread; never blocks."""
        data = encode(frame)
        try:
            self._token.run_sync_soon(self._send.send_nowait, data)
        except trio.RunFinishedError:
            pass

    async def writer(self) -> None:
        async for data in self._recv:
            await self.stream.send_all(data)

    async def reader(self) -> None:
        frames = FrameBuffer()
        while True:
            data = await self.stream.receive_some(1 << 16)
            if not data:
                log.info("supervisor closed the socket; exiting")
                os._exit(0)
            try:
                bodies = frames.feed(data)
                for body in bodies:
                    self._dispatch(decode_to_worker(body))
            except ProtocolError as exc:
                log.error("protocol error from supervisor: %s", exc)
                os._exit(2)

    def _dispatch(self, frame: ToWorker) -> None:
        if isinstance(frame, Ping):
            e = self.engine
            self.emit(
                Pong(
                    seq=frame.seq,
                    active=e.active if e else 0,
                    queued=e.queued if e else 0,
                    threads=e.threads if e else 0,
                    prompt_tokens_decoded=(e.prompt_tokens_decoded + (e.images.decoded_tokens if e.images else 0)) if e else 0,
                    kv_cells_used=e.kv_cells_used if e else 0,
                    kv_repairs=e.kv.repairs if e else 0,
                    kv_prefixes_refused=e.kv.prefixes_refused if e else 0,
                    prompt_cache=cache_counts(e) if e else {},
                )
            )
        elif isinstance(frame, SlotsQuery):
            # Answered here, like Ping: a read of the slots, which the engine never waits on.
            e = self.engine
            self.emit(SlotsResult(id=frame.id, slots=slot_states(e.slots, e.n_ctx_slot) if e else []))
        elif isinstance(frame, Shutdown):
            self.draining = True
            trio.lowlevel.spawn_system_task(self._shutdown, frame.grace)
        elif self.engine is None:
            self.early.append(frame)
        else:
            if self.draining and isinstance(frame, Generate):
                # The supervisor stops routing before it sends Shutdown; this is a race.
                self.emit(Error(id=frame.id, code="unavailable", message="the model's worker is shutting down"))
                return
            self.engine.submit(frame)

    async def _shutdown(self, grace: float) -> None:
        """Let requests in flight finish for up to `grace` seconds, then exit."""
        deadline = time.monotonic() + grace
        while self.engine is not None and (self.engine.active or self.engine.queued):
            if time.monotonic() >= deadline:
                for rid in list(self.engine.requests.by_id):
                    self.engine.submit(Cancel(id=rid))
                await trio.sleep(0.1)
                break
            await trio.sleep(0.05)
        if self.engine is not None:
            # A clean stop: the hottest prompts go to disk for the next run (within
            # PERSIST_SECONDS, which the supervisor's stop allows for).
            await trio.to_thread.run_sync(self.engine.persist, PERSIST_SECONDS, abandon_on_cancel=True)
        await self.flush_and_exit(0)

    async def flush_and_exit(self, code: int, timeout: float = 1.0) -> None:
        """Give the writer up to `timeout` to send the frames already queued, then exit."""
        with trio.move_on_after(timeout):
            await trio.sleep(0.05)  # frames handed over with run_sync_soon land first
            while self._recv.statistics().current_buffer_used:
                await trio.sleep(0.01)
        os._exit(code)


async def serve(fd: int, spec: WorkerSpec) -> None:
    from worker.model import LoadError

    sock = trio.socket.from_stdlib_socket(socket.socket(fileno=fd))
    link = Link(trio.SocketStream(sock))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.writer)
        nursery.start_soon(link.reader)

        last = -1.0

        def progress(p: float) -> None:
            nonlocal last
            if p >= 1.0 or p - last >= 0.05:
                last = p
                link.emit(Loading(progress=round(p, 3)))

        try:
            model, vocabulary = await trio.to_thread.run_sync(load_with_vocabulary, spec, progress, abandon_on_cancel=True)
            draft = await trio.to_thread.run_sync(draft_model.for_spec, spec, model, abandon_on_cancel=True)
            projector = await trio.to_thread.run_sync(load_projector, spec, model, abandon_on_cancel=True)
        except LoadError as exc:
            # The log gets the path; the Failed frame, which clients see, does not.
            log.error("load failed: %s", exc.detail)
            link.emit(Failed(message=exc.message))
            await link.flush_and_exit(1, timeout=2.0)
            return
        except Exception as exc:  # anything else from llama.cpp's load path
            log.exception("load failed")
            link.emit(Failed(message=f"load failed ({type(exc).__name__}); see the server log"))
            await link.flush_and_exit(1, timeout=2.0)
            return

        engine = Engine(
            model, link.emit, embeddings=spec.embeddings, n_ctx_slot=spec.n_ctx_slot, cache=cache_options(spec, model),
            vocabulary=vocabulary, draft_max=0 if spec.spec_type == "none" else spec.draft_max, draft_model=draft,
            projector=projector,
        )
        for frame in link.early:
            engine.submit(frame)
        link.early.clear()
        link.engine = engine
        link.emit(
            Ready(
                n_ctx=model.n_ctx,
                n_ctx_slot=engine.n_ctx_slot,
                slots=len(engine.slots),
                n_vocab=model.n_vocab,
                n_ctx_train=model.n_ctx_train,
                has_template=model.template is not None,
                embeddings=spec.embeddings,
                n_embd=model.n_embd,
                description=model.description,
                max_token_bytes=model.max_token_bytes() or 0,
                chat_template=model.template_source,
                bos_token=model.bos_text,
                eos_token=model.eos_text,
                build_info=f"llama-cpp-python {llama_cpp_version()}",
                tool_format=model.template.format.tools if model.template is not None else None,
                reasoning=model.template.format.reasoning if model.template is not None else False,
                reasoning_tags=model.template.format.reasoning_tags if model.template is not None else ("<think>", "</think>"),
                fim_missing=model.fim.missing(),
                vision=projector is not None and projector.vision,
                audio=projector is not None and projector.audio,
                device_bytes=model.device_bytes,
            )
        )
        log.info("%s ready: n_ctx=%d slots=%d n_batch=%d", spec.name, model.n_ctx, len(engine.slots), model.n_batch)
        await trio.to_thread.run_sync(engine.run, abandon_on_cancel=True)


def load_projector(spec: WorkerSpec, model: LoadedModel) -> Projector | None:
    """The model's projector (`mmproj`), if it has one; a LoadError when it cannot load."""
    if spec.mmproj is None:
        return None
    import llama_cpp

    from worker.media.projector import Projector as Loaded

    return Loaded(
        spec.mmproj, model.model, model.threads, int(llama_cpp.llama_n_ubatch(model.ctx)), use_gpu=spec.n_gpu_layers != 0
    )


def cache_counts(e: Engine) -> dict[str, int]:
    """The prompt cache's and speculation's counters and sizes, for Pong. Read from this
    thread, not the engine's: each value is one int read whole, a step old at worst."""
    counts = {
        "prompts_reused": e.admission.reused,
        "prompts_missed": e.admission.missed,
        "tokens_reused": e.admission.tokens_reused,
        "parked": len(e.entries.parked),
        "parked_hits": e.entries.hits,
        "parked_evictions": e.entries.evictions,
        "requests_parked": e.room.parked,
        "tokens_resumed": e.admission.tokens_resumed,
        "draft_tokens": e.spec.drafted,
        "draft_accepted": e.spec.accepted,
    }
    if e.images is not None:
        counts["images_encoded"] = e.images.encoder.encodes
        counts["images_reused"] = e.images.encoder.reused
    counts.update(e.cache.counts())
    return counts


def load_with_vocabulary(spec: WorkerSpec, progress: Callable[[float], None]) -> tuple[LoadedModel, LLTokenizer | None]:
    """Load the model, then, for a model that generates, build llguidance's view of its
    vocabulary (structured output). It costs a second or two, most of it holding Python's
    GIL (llguidance builds it in Rust without letting go; the tokens' bytes it starts from
    come from a cache, worker/vocab_pieces.py): built here, before the worker is ready, it
    delays no stream; built by the first constrained request, it stalled every
    stream of the model for as long (bench/first_constraint.py). When it fails, the first
    constrained request tries again."""
    from worker.model import load

    model = load(spec, progress)
    if spec.embeddings:
        return model, None
    t0 = time.perf_counter()
    try:
        pieces = vocab_pieces.for_model(spec.path, llama_cpp_version(), model.vocab, model.n_vocab, model.is_eog)
        vocabulary = tokenizer_for(model.vocab, model.n_vocab, model.is_eog, pieces)
    except Exception:
        log.exception("building the structured-output vocabulary failed; the first constrained request retries")
        return model, None
    log.info("structured-output vocabulary built in %.2f s", time.perf_counter() - t0)
    return model, vocabulary


def cache_options(spec: WorkerSpec, model: LoadedModel) -> CacheOptions:
    """The prompt cache's budgets and folder (`<prompt_cache_dir>/<model name>`), and the
    fingerprint its files must carry to be read back."""
    folder = None
    if spec.prompt_cache_dir is not None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec.name).lstrip(".") or "model"
        folder = Path(spec.prompt_cache_dir) / safe
    att = model.attention
    layout = f"n_ctx={model.n_ctx} swa_full={spec.swa_full} n_swa={att.n_swa} gpu={spec.n_gpu_layers}"
    # Cells saved under other KV types or flash attention (which stores V transposed or
    # not) do not read back; under other RoPE values or metadata they would read back and
    # be silently wrong (keys are stored rotated).
    layout += " " + " ".join(f"{k}={getattr(spec, k)}" for k in CELL_OPTIONS)
    # A saved prompt of a LoRA set names its adapters by index (worker/adapter_turns.py):
    # another list, or another file at a path, would give it to another computation.
    layout += " lora=" + ";".join(_file_identity(a.path) for a in spec.lora)
    return CacheOptions(
        ram_bytes=spec.prompt_cache_bytes,
        folder=folder,
        disk_bytes=spec.prompt_cache_disk_bytes,
        fingerprint=fingerprint(spec.path, model.template_source, llama_cpp_version(), layout),
        persist_seconds=PERSIST_SECONDS - 1.0,
    )


def _file_identity(path: str) -> str:
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def llama_cpp_version() -> str:
    import llama_cpp  # the worker has it loaded already; imported here to keep startup lean

    return str(getattr(llama_cpp, "__version__", "unknown"))
