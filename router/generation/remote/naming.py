"""A translated request's errors, in the words of the request the client sent.

The writers (outbound.py, anthropic_request.py) refuse what an upstream cannot take by the
internal job's field names: `seed`, `max_tokens`, `logprobs`. The client wrote
`options.seed` (Ollama), `n_predict` or `n_probs` (llama-server's /completion),
`max_output_tokens` (Responses). Each dialect gives its job those names (`GenerationJob.names`),
and a refusal raised while its request is written is renamed here, its message with it:
every bad input gets an error that names the parameter as the client sent it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from router.generation.job import GenerationJob
from supervisor.errors import InvalidRequest, Unsupported


def renamed(exc: InvalidRequest | Unsupported, names: Mapping[str, str]) -> None:
    """Rename `exc`'s parameter, and its quoted mentions in the message, in place."""
    new = names.get(exc.param or "")
    if not new or new == exc.param:
        return
    exc.message = exc.message.replace(f"'{exc.param}'", f"'{new}'")
    exc.args = (exc.message,)
    exc.param = new


@contextmanager
def in_request_terms(job: GenerationJob) -> Iterator[None]:
    """Errors raised within name `job`'s parameters as its request did."""
    try:
        yield
    except (InvalidRequest, Unsupported) as exc:
        renamed(exc, job.names)
        raise
