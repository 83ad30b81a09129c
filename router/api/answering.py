"""A generation job answered over HTTP in any dialect: whole, or streamed as it is made.

The job's first event is awaited before any header (Generation.start), so that an error
such as a prompt too long for the context is the response's status; the Generation is
closed when its answer is done, however it ends (a client gone mid-stream included).
"""

from __future__ import annotations

import dataclasses
import time
from typing import AsyncIterator, Awaitable, Callable, Mapping, Sequence, Union

from quart import Response

from router.generation.events import Event
from router.generation import image_urls, instances
from router.generation.job import GenerationJob
from router.generation.prompts import Prompt, is_tokens
from router.generation.remote.count import count_tokens
from router.generation.remote.outbound import sent_fields
from router.generation.remote.run import RemoteGeneration
from router.generation.run import Generation
from router.generation.stream import events
from router.server import access_log, auth, sse
from router.upstream.remote import RemoteModel
from supervisor import priority
from supervisor.config import projector
from supervisor.errors import Unsupported
from supervisor.group import ModelGroup, Served
from supervisor.handle import ModelHandle
from worker.protocol import EmbedResult, Media, SamplingParams

Whole = Callable[[AsyncIterator[Event]], Awaitable[bytes]]
Streamed = Callable[[AsyncIterator[Event]], AsyncIterator[bytes]]
# What a route that generates runs its job on: a local model, or one served elsewhere that
# the request reaches through translation (router/upstream/remote.py).
Target = Union[Served, RemoteModel]


def job_for(
    target: Target, make: Callable[[SamplingParams], GenerationJob], names: Mapping[str, str] | None = None
) -> GenerationJob:
    """The job `make` builds from the target's generation defaults: a local model's
    config; for a model served elsewhere, Corral's, with the fields the client set marked,
    as only those are sent (router/generation/remote/outbound.py), and `names`, the
    dialect's own for the job's fields, for the errors of its translation."""
    if isinstance(target, RemoteModel):
        job = sent_fields(make)
        return dataclasses.replace(job, names=names) if names else job
    return make(target.spec.defaults)


async def answer(
    target: Target,
    job: GenerationJob,
    whole: Whole,
    streamed: Streamed,
    content_type: str = "application/json",
    stream_headers: Mapping[str, str] = sse.HEADERS,
) -> Response:
    """Run `job` on the target's model; `whole` renders the events into one body,
    `streamed` into the chunks of a streamed one (when the job streams)."""
    job = await _images_fetched(target, job)
    if isinstance(target, RemoteModel):
        remote = await RemoteGeneration.start(target, job)
        if not job.stream:
            try:
                body = await whole(remote.events())
            finally:
                await remote.aclose()
            return Response(body, content_type=content_type)
        streamed_body = sse.Body(streamed(remote.events()), lambda: None, remote.aclose)
        return Response(streamed_body, status=200, headers=dict(stream_headers))
    gen = await Generation.start(target, job)
    if not job.stream:
        try:
            body = await whole(events(gen, job))
        finally:
            gen.close()
        return Response(body, content_type=content_type)
    return Response(sse.Body(streamed(events(gen, job)), gen.close), status=200, headers=dict(stream_headers))


async def _images_fetched(target: Target, job: GenerationJob) -> GenerationJob:
    """`job` with its image URLs fetched; a local model without a projector that takes its
    images or its audio refuses them first, before it loads or anything is fetched."""
    if job.images and isinstance(target, (ModelHandle, ModelGroup)):
        _check_takes(job.images, target.spec.mmproj)
    return await image_urls.fetched(job)


def _check_takes(media: Sequence[Media], mmproj: str | None) -> None:
    """An Unsupported naming the first of `media` that a model with projector `mmproj`
    (None: none) cannot take, read from the projector's header."""
    takes = projector.modalities(mmproj)
    for m in media:
        kind, what = ("audio", "audio") if m.kind == "audio" else ("vision", "images")
        if kind not in takes:
            why = "its config names no projector (mmproj)" if mmproj is None else f"its projector has no {kind} encoder"
            raise Unsupported(f"This model does not take {what}: {why}.", m.param)


async def started(handle: Served, job: GenerationJob) -> tuple[Generation, AsyncIterator[Event]]:
    """The job started, and its events, for a dialect that needs the worker's answer (its
    `Ready`) to shape the response; the caller closes the Generation."""
    gen = await Generation.start(handle, await _images_fetched(handle, job))
    return gen, events(gen, job)


async def embed(
    handle: Served,
    inputs: Sequence[Prompt],
    truncate: bool = False,
    rank_query: str | None = None,
    normalize: int = 2,
    native: bool = False,
) -> EmbedResult:
    """Embed texts, or token arrays, on `handle`'s model (`truncate`: cut an input too long
    at its end, rather than refuse it; `normalize`, `native`: as worker/protocol's Embed). In the model's slot line like a generation
    (max_queue's 429, queue_timeout's 503): an input a slot, up to all of them. A client
    that leaves is dropped from the line, or its job is cancelled in the worker within one
    batch. A model of several instances embeds on the least busy, failing over as a
    generation does (router/generation/instances.py)."""
    if isinstance(handle, ModelGroup):
        return await instances.run_on_instance(
            handle, None, lambda h, attempt: _embed(h, inputs, truncate, rank_query, normalize, native, attempt)
        )
    return await _embed(handle, inputs, truncate, rank_query, normalize, native)


async def _embed(
    handle: ModelHandle,
    inputs: Sequence[Prompt],
    truncate: bool,
    rank_query: str | None,
    normalize: int,
    native: bool,
    attempt: instances.Attempt | None = None,
) -> EmbedResult:
    record = access_log.current()
    asked = time.monotonic()
    async with handle.lease() as conn:
        leased = time.monotonic()
        ticket = await handle.take_slots(conn, len(inputs), priority.place(auth.current_key(), None))
        if record is not None:
            record.load_wait, record.slot_wait = leased - asked, time.monotonic() - leased
        try:
            if attempt is not None:
                attempt.sent = True  # the worker holds it from here on
            texts = [x for x in inputs if isinstance(x, str)]
            if rank_query is not None:  # a rerank: texts, each scored against the query
                return await conn.embed(texts, rank_query=rank_query)
            tokens: list[list[int]] | None = None
            parts: list[list[int | str]] | None = None
            if len(texts) < len(inputs):
                if all(is_tokens(x) for x in inputs):
                    tokens = [[t for t in x if isinstance(t, int)] for x in inputs]
                else:  # mixed
                    parts = [[x] if isinstance(x, str) else list(x) for x in inputs]
                texts = []
            return await conn.embed(
                texts, tokens=tokens, parts=parts, truncate=truncate, normalize=normalize, native=native
            )
        finally:
            ticket.release()


async def prompt_tokens(target: Target, job: GenerationJob) -> int:
    """How many tokens the prompt of `job` (a chat) would be, rendered and tokenized as its
    generation would, for the routes that count input tokens (llama-server's
    input_tokens, Anthropic's count_tokens, Responses' input_tokens). Generates nothing;
    the model loads, as its template and tokenizer are the model's. The access log counts
    them as the request's prompt. A model served elsewhere has no tokenizer here: its
    upstream counts, where it speaks Anthropic's API; else a 400."""
    if isinstance(target, RemoteModel):
        if target.speaks == "anthropic":
            return await count_tokens(target, await image_urls.fetched(job))  # its count_tokens
        raise Unsupported(
            f"The model `{target.name}` is served by an upstream that speaks only OpenAI's API, "
            "which has no route to count a prompt's tokens.", "model",
        )
    handle = target
    job = await _images_fetched(handle, job)
    async with handle.lease() as conn:
        offered = list(job.tools.offered) if job.tools.offered else None
        prompt = await conn.render(list(job.messages or ()), offered, job.template_kwargs)
        n = len(await conn.tokenize(prompt, add_special=True, media=job.images or None))
    record = access_log.current()
    if record is not None:
        record.prompt_tokens, record.generated_tokens = n, 0
    return n
