"""A chat's prompt tokens counted by an upstream that speaks Anthropic's Messages API
(POST /v1/messages/count_tokens), for the routes that count input tokens (Responses'
input_tokens, llama-server's /v1/chat/completions/input_tokens): the only upstream API
Corral translates to that can count a prompt. The count is the upstream's, of its own
rendering of the conversation.
"""

from __future__ import annotations

from router.generation.job import GenerationJob
from router.generation.remote.anthropic_request import conversation_body
from router.generation.remote.naming import in_request_terms
from router.generation.remote.run import fetch
from router.server import access_log, json_text
from router.upstream.remote import RemoteModel
from supervisor.errors import WorkerCrashed

# The most of an answer read: a count is a few bytes; an error object, a few kilobytes.
MAX_BYTES = 64 * 1024


async def count_tokens(remote: RemoteModel, job: GenerationJob) -> int:
    with in_request_terms(job):
        request = conversation_body(job, remote.spec.model)
    body, raw, _ = await fetch(remote, "/v1/messages/count_tokens", request, MAX_BYTES)
    try:
        n = json_text.loads(raw).get("input_tokens")
    except (ValueError, AttributeError):
        n = None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        body.broken("a token count that is not one")
        raise WorkerCrashed(f"The upstream of model `{remote.name}` answered a token count without input_tokens.")
    if (record := access_log.current()) is not None:
        record.prompt_tokens, record.generated_tokens = n, 0
    return n
