"""`corral chat --config`: replies from the model's own worker, started by Corral's own
supervisor in this process, with no HTTP in between.

A reply goes the way a /v1/chat/completions request goes below its route: the same body
is decoded into a ChatRequest, `chat_job` makes it a GenerationJob (the model's
max_tokens default included), `Generation` takes the lease and a slot and sends Generate,
and each choice's ChatOutput splits the worker's text into content and reasoning. Only the
SSE formatting is left out.

The supervisor runs on a trio loop in a thread of its own, so that the terminal keeps the
main thread: Python delivers Ctrl-C there as KeyboardInterrupt, in the middle of input()
or of waiting for the next piece, which is what the chat needs (the worker ignores
SIGINT; it reaches the whole process group). Pieces cross to the main thread through a
queue; stopping a reply cancels its task, whose Generation.close() cancels the request
in the worker and frees the slot.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Generator, Sequence

import msgspec
import trio

from corral.chat.session import TOO_LONG_HINT, ChatError, Event, Finished, Piece
from router.api.openai import schemas
from router.api.openai.translate import chat_job
from router.generation import events as ev_
from router.generation.run import Generation
from router.generation.stream import events
from router.server.json_body import decode
from supervisor.config import Config
from supervisor.errors import ContextOverflow, CorralError
from supervisor.supervisor import Supervisor

# How long closing waits for the workers to stop: Shutdown, then SIGTERM, then SIGKILL,
# each after stop_grace, as `corral serve` bounds it.
_STOP_SLACK = 5.0


@dataclass(frozen=True)
class _Failed:
    message: str


class _Done:
    pass


_DONE = _Done()


def only_model(cfg: Config, model: str) -> Config:
    """`cfg` cut down to the one model `model` names (by name or alias), kept loaded for
    the whole chat, and failing at once rather than retrying: nobody else waits on it,
    and the person at the terminal wants the error. Raises ChatError naming the models
    there are."""
    spec = cfg.resolve(model)
    if spec is None:
        names = ", ".join(cfg.models) or "none"
        raise ChatError(f"{cfg.source or 'the config'} has no model {model!r} (its models: {names})")
    if spec.embeddings:
        raise ChatError(f"the model {model!r} serves embeddings only (embeddings = true): it cannot chat")
    spec = msgspec.structs.replace(spec, idle_timeout=0.0, preload=False)
    supervisor = msgspec.structs.replace(cfg.supervisor, start_retries=1, max_loaded_models=0)
    return dataclasses.replace(cfg, models={spec.name: spec}, supervisor=supervisor)


class LocalChat:
    """The supervisor and one model, in this process. `start()` before `reply()`,
    `close()` at the end; all three block, and are called from one (non-trio) thread."""

    def __init__(self, cfg: Config, model: str, worker_command: Sequence[str] | None = None) -> None:
        self.config = only_model(cfg, model)
        self.model = model
        self._supervisor = Supervisor(self.config, worker_command=worker_command)
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._up = threading.Event()
        self._crash: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="corral-chat-supervisor", daemon=True)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # kept for the main thread, which says what it was
            self._crash = exc
        finally:
            self._up.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(self._supervisor.run)
            self._nursery = nursery
            self._up.set()
            await self._stop.wait()
            s = self.config.supervisor
            with trio.move_on_after(3 * s.stop_grace + _STOP_SLACK):
                await self._supervisor.stop()
            nursery.cancel_scope.cancel()

    def start(self) -> None:
        """Start the supervisor and load the model; returns when it is ready. Raises
        ChatError if it cannot load."""
        self._thread.start()
        self._up.wait()
        if self._crash is not None or self._token is None:
            raise ChatError(f"the supervisor did not start: {self._crash!r}")
        try:
            trio.from_thread.run(self._supervisor.resolve(self.model).ensure_ready, trio_token=self._token)
        except CorralError as exc:
            raise ChatError(exc.message) from None
        except trio.RunFinishedError:
            raise ChatError(f"the supervisor stopped: {self._crash!r}") from None

    def reply(self, body: dict[str, Any]) -> Generator[Event, None, None]:
        """The reply's pieces as they arrive, then Finished. Closing the iterator early
        (Ctrl-C) cancels the generation and waits until its slot is free."""
        pieces: queue.Queue[Event | _Failed | _Done] = queue.Queue()
        scope = trio.CancelScope()
        if self._token is None or self._nursery is None:
            raise ChatError("the chat has not started")
        try:
            trio.from_thread.run_sync(
                self._nursery.start_soon, partial(self._generate, body, pieces, scope), trio_token=self._token
            )
        except (trio.RunFinishedError, RuntimeError):  # the loop ended, or its nursery closed
            raise ChatError(f"the supervisor stopped: {self._crash!r}") from None
        done = False
        try:
            while True:
                item = pieces.get()
                if isinstance(item, _Done):
                    done = True
                    return
                if isinstance(item, _Failed):
                    raise ChatError(item.message)
                yield item
        finally:
            if not done:
                trio.from_thread.run_sync(scope.cancel, trio_token=self._token)
                while not isinstance(pieces.get(), _Done):  # the task's finally has run
                    pass

    async def _generate(
        self, body: dict[str, Any], out: queue.Queue[Event | _Failed | _Done], scope: trio.CancelScope
    ) -> None:
        """One reply, as the chat route runs it: decode, job, Generation, its events."""
        try:
            with scope:
                r: schemas.ChatRequest = decode(json.dumps(body).encode(), schemas.ChatRequest)
                handle = self._supervisor.resolve(r.model)
                job = chat_job(r, r.model or handle.name, handle.spec.defaults)
                gen = await Generation.start(handle, job)
                try:
                    async for ev in events(gen, job):
                        if isinstance(ev, ev_.ReasoningDelta) and ev.text:
                            out.put(Piece(ev.text, reasoning=True))
                        elif isinstance(ev, ev_.TextDelta) and ev.text:
                            out.put(Piece(ev.text))
                        elif isinstance(ev, ev_.Finish):
                            out.put(Finished(ev.reason, ev.usage.completion_tokens))
                        elif isinstance(ev, ev_.Failed):
                            raise ev.error
                finally:
                    gen.close()
        except ContextOverflow as exc:
            out.put(_Failed(exc.message + TOO_LONG_HINT))
        except CorralError as exc:
            out.put(_Failed(exc.message))
        except Exception as exc:  # the main thread must hear of it, or it waits forever
            out.put(_Failed(f"internal error: {exc!r}"))
        finally:
            out.put(_DONE)

    def close(self) -> None:
        """Stop the workers gracefully and the loop; returns once they are gone."""
        if self._token is not None and self._stop is not None and self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        if self._thread.is_alive():
            self._thread.join()
