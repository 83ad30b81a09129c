"""A translated request's refusals named as its client wrote the parameter
(router/generation/remote/naming.py)."""

from __future__ import annotations

import pytest

from router.generation.job import GenerationJob
from router.generation.remote.naming import in_request_terms, renamed
from supervisor.errors import InvalidRequest, Unsupported, WorkerCrashed
from worker.protocol import SamplingParams


def test_the_parameter_and_its_quoted_mentions_are_renamed() -> None:
    exc = Unsupported("'seed' cannot be sent to this model's upstream: no 'seed' there.", "seed")
    renamed(exc, {"seed": "options.seed"})
    assert exc.param == "options.seed" and str(exc) == exc.message
    assert exc.message == "'options.seed' cannot be sent to this model's upstream: no 'options.seed' there."


def test_a_name_the_dialect_shares_or_a_word_in_the_text_is_left() -> None:
    exc = InvalidRequest("'n' cannot be sent: one answer (seed unset).", "n")
    renamed(exc, {"seed": "options.seed"})
    assert (exc.param, exc.message) == ("n", "'n' cannot be sent: one answer (seed unset).")


def test_errors_raised_while_a_job_is_written_are_renamed_and_others_pass() -> None:
    job = GenerationJob(model="m", params=SamplingParams(), names={"max_tokens": "max_output_tokens"})
    with pytest.raises(Unsupported) as caught:
        with in_request_terms(job):
            raise Unsupported("'max_tokens' must be above 8192.", "max_tokens")
    assert caught.value.param == "max_output_tokens" and caught.value.message == "'max_output_tokens' must be above 8192."
    with pytest.raises(WorkerCrashed):
        with in_request_terms(job):
            raise WorkerCrashed("the upstream went away")
