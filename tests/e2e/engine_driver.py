"""The worker's engine in this process, on the demo model, driven as the worker's link would
drive it: Generate and Cancel frames in, the frames it emits collected per request. No
processes and no HTTP, so that a randomized test can run thousands of request mixes, and
can look at the engine's slots and the KV cache's cells between them."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from dataclasses import dataclass, field

from tests.e2e.kv_state import cache_positions
from worker import draft_model
from worker.engine import Engine
from worker.link import load_projector
from worker.media.spans import is_placeholder
from worker.model import LoadedModel, load
from worker.prompt_cache import CacheOptions
from worker.protocol import Cancel, Error, Frame, Generate, Media, SamplingParams, Step, TokenLogprob, WorkerSpec


@dataclass
class Outcome:
    """What one Generate produced: each choice's tokens and finish reason, or an error."""

    n: int
    tokens: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    cached: dict[int, int] = field(default_factory=dict)  # prompt tokens read from the cache
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class EngineDriver:
    def __init__(self, spec: WorkerSpec, cache: CacheOptions | None = None, draft_max: int | None = None) -> None:
        """`draft_max` None: speculative decoding as the worker runs `spec` (on by default,
        so that every test of the engine drives it too)."""
        self.spec = spec
        self.model: LoadedModel = load(spec, lambda p: None)
        if draft_max is None:
            draft_max = 0 if spec.spec_type == "none" else spec.draft_max
        self.draft = draft_model.for_spec(spec, self.model)  # with spec.draft_model
        self.projector = load_projector(spec, self.model)  # with spec.mmproj
        self.engine = Engine(
            self.model, self._emit, cache=cache, draft_max=draft_max, draft_model=self.draft, projector=self.projector
        )
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._outcomes: dict[int, Outcome] = {}
        self.frames_with: collections.Counter[int] = collections.Counter()  # Step frames per request id
        # The engine thread runs until the process ends, as in the worker.
        threading.Thread(target=self.engine.run, name="engine", daemon=True).start()

    def _emit(self, frame: Frame) -> None:
        with self._lock:
            if isinstance(frame, Step):
                self.frames_with.update({ev.id for ev in frame.events})
                for ev in frame.events:
                    o = self._outcomes.get(ev.id)
                    if o is None:
                        continue
                    o.tokens.setdefault(ev.index, []).extend(ev.tokens)
                    if ev.prompt_usage is not None:
                        o.cached[ev.index] = ev.prompt_usage.cached_tokens
                    o.logprobs.setdefault(ev.index, []).extend(ev.logprobs)
                    if ev.finish_reason is not None:
                        o.finish[ev.index] = ev.finish_reason
                        if len(o.finish) == o.n:
                            o.done.set()
            elif isinstance(frame, Error):
                o = self._outcomes.get(frame.id)
                if o is not None:
                    o.error = f"{frame.code}: {frame.message}"
                    o.done.set()

    def generate(
        self,
        tokens: list[int],
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        n: int = 1,
        logprobs: int | None = None,
        hold: bool = False,
        stop: list[str] | None = None,
        scope: str = "",
        prompt: str | None = None,
        media: list[bytes] | None = None,
        priority: int = 1,
        adapters: list[tuple[int, float]] | None = None,
    ) -> tuple[int, Outcome]:
        """A request of `tokens`, or of the text `prompt` with an image (`media`) for each of
        its media markers."""
        rid = next(self._ids)
        outcome = Outcome(n=n)
        with self._lock:
            self._outcomes[rid] = outcome
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=True, logprobs=logprobs,
            stop=stop or [],
        )
        images = [Media(data=b, param=f"image[{i}]") for i, b in enumerate(media)] if media else None
        self.engine.submit(
            Generate(
                id=rid, params=params, prompt_tokens=None if prompt is not None else list(tokens),
                prompt=prompt, media=images, n=n, hold_events=hold, cache_scope=scope, priority=priority,
                adapters=adapters or [],
            )
        )
        return rid, outcome

    def cancel(self, rid: int) -> None:
        """Cancel `rid` as a disconnecting client does; its outcome no longer matters (a
        request still being prepared is dropped without a word)."""
        with self._lock:
            o = self._outcomes.pop(rid, None)
        if o is not None:
            o.done.set()
        self.engine.submit(Cancel(id=rid))

    def run_alone(self, tokens: list[int], max_tokens: int, timeout: float = 120.0) -> Outcome:
        """A greedy request on its own, with its top-2 logprobs."""
        _, o = self.generate(tokens, max_tokens, logprobs=2)
        assert o.done.wait(timeout), "the request did not finish"
        assert o.error is None, o.error
        return o

    def wait_idle(self, timeout: float = 120.0) -> None:
        """Until no request is running, waiting or being prepared, seen twice in a row."""
        deadline = time.monotonic() + timeout
        calm = 0
        while calm < 2:
            assert time.monotonic() < deadline, "the engine did not become idle"
            e = self.engine
            calm = calm + 1 if e.active == 0 and e.queued == 0 and e.inbox.empty() else 0
            time.sleep(0.05)

    def cell_problems(self) -> list[str]:
        """Every sequence's books (the slots', the parked entries', and the free ids', which
        must hold nothing) against the cells of each of its KV caches, read from llama.cpp's
        state: the full-attention cache must hold exactly positions 0 .. n-1, the
        sliding-window one a contiguous run ending at n-1 that reaches down to the window of
        position n. Call only while the engine is idle."""
        problems = []
        if self.engine.kv.sets_crossed:  # cells decoded under one LoRA set into another's sequence
            problems.append(f"{self.engine.kv.sets_crossed} decodes crossed LoRA sets")
        att = self.model.attention
        seqs = [*self.engine.slots, *self.engine.entries.checked()]
        ids = [s.seq_id for s in seqs]
        if sorted(ids) != list(range(self.model.n_seq_max)):
            problems.append(f"the slots, entries and free ids are not each sequence once: {sorted(ids)}")
        for slot in seqs:
            n = len(slot.cache)
            caches = cache_positions(self.model.ctx, slot.seq_id, att.mrope)
            full, *sliding = caches
            if full != expected_cells(slot.cache, att.mrope):
                problems.append(f"slot {slot.seq_id}: {n} tokens, full-attention cells {_runs(full)}")
            for cells in sliding:
                # The state leaves out cells hidden from the last position (n - 1); those
                # position n needs must all be there.
                if n == 0:
                    ok = not cells
                else:
                    ok = bool(cells) and cells == list(range(cells[0], n)) and cells[0] <= att.lowest_needed(n)
                if not ok:
                    problems.append(f"slot {slot.seq_id}: {n} tokens, sliding-window cells {_runs(cells)}")
        if self.draft is not None:
            # The draft model's sequences: each book against its full-attention cells.
            problems += self.draft.problems()
            for seq, book in enumerate(self.draft.books):
                n = len(book)
                full, *sliding = cache_positions(self.draft.ctx, seq)
                if full != list(range(n)):
                    problems.append(f"draft sequence {seq}: {n} tokens, cells {_runs(full)}")
                for cells in sliding:
                    needed = self.draft.attention.lowest_needed(n) if n else 0
                    if n and not (cells and cells == list(range(cells[0], n)) and cells[0] <= needed):
                        problems.append(f"draft sequence {seq}: {n} tokens, sliding-window cells {_runs(cells)}")
        return problems


def expected_cells(tokens: list[int], mrope: bool) -> list[int]:
    """The positions, in order, of the cells a sequence holding `tokens` must have: 0 .. n-1,
    but every token of an M-RoPE image at the image's first position, and the text after
    it where worker/kv_positions.py says (each as many times as it has tokens)."""
    if not mrope:
        return list(range(len(tokens)))
    cells: list[int] = []
    pos = i = 0
    while i < len(tokens):
        if is_placeholder(tokens[i]):
            j = i
            while j < len(tokens) and is_placeholder(tokens[j]):
                j += 1
            cells += [pos] * (j - i)
            pos += sum(t % 2 for t in tokens[i:j])  # the image's n_pos: its odd ids
            i = j
        else:
            cells.append(pos)
            pos += 1
            i += 1
    return sorted(cells)


def _runs(positions: list[int]) -> str:
    """Positions as runs, 0..699,750..800: what a failure message can show."""
    if not positions:
        return "none"
    out, start, prev = [], positions[0], positions[0]
    for p in positions[1:]:
        if p != prev + 1:
            out.append(f"{start}..{prev}")
            start = p
        prev = p
    out.append(f"{start}..{prev}")
    return ",".join(out)
