"""llama-server's own response objects: /completion answers and events, timings, the
generation settings, /props and /slots.

Shapes follow llama.cpp's tools/server/README.md, so its clients (llama.vim, llama.vscode,
scripts written against llama-server) read Corral's answers unchanged. Pure functions over
the internal events and the worker's frames; router/api/llama/routes.py sends what they
build.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, Sequence

import msgspec

from router.api.timings import timings_json
from router.generation.events import Finish, TextDelta
from router.server import sse
from supervisor.config import Config
from router.generation.media import LLAMA_MEDIA_MARKER
from worker.protocol import Ready, SamplingParams, SlotState, StopType, TokenLogprob

_json = msgspec.json.Encoder()

# llama.cpp's LLAMA_DEFAULT_SEED: what llama-server shows for "a random seed".
RANDOM_SEED = 0xFFFFFFFF
# The samplers a Corral chain applies, in its order (worker/sampling.py), in llama-server's
# names; `penalties` only acts when a penalty is set.
SAMPLERS = ["penalties", "top_k", "top_p", "min_p", "temperature"]


def params_json(p: SamplingParams, stream: bool = False) -> dict[str, Any]:
    """A request's sampling settings as llama-server's `generation_settings` / slot
    `params` name them; the samplers Corral does not have show their disabled values."""
    return {
        "n_predict": -1 if p.max_tokens is None else p.max_tokens,
        "seed": RANDOM_SEED if p.seed is None else p.seed & 0xFFFFFFFF,
        "temperature": p.temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "typical_p": 1.0,
        "repeat_last_n": p.repeat_last_n,
        "repeat_penalty": p.repeat_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "dry_multiplier": 0.0,
        "mirostat": 0,
        "stop": list(p.stop),
        "max_tokens": -1 if p.max_tokens is None else p.max_tokens,
        "n_keep": 0,
        "ignore_eos": p.ignore_eos,
        "stream": stream,
        "n_probs": p.logprobs or 0,
        "min_keep": 0,
        "grammar": "",
        "samplers": list(SAMPLERS),
        "timings_per_token": p.timings_per_token,
    }


@dataclass
class NativeCompletion:
    """One /completion answer being built: what every event repeats."""

    model: str  # as the client named it
    params: SamplingParams
    n_ctx: int  # the most tokens one request holds (the slot's context)
    stream: bool = False
    return_tokens: bool = False
    response_fields: list[str] | None = None  # the final answer's fields, when given

    def settings(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "model": self.model, **params_json(self.params, self.stream)}

    def event(self, ev: TextDelta, n_predicted: int) -> bytes:
        """One streamed event: its text and tokens, `stop: false` (llama-server sends the
        token ids in every streamed event)."""
        obj: dict[str, Any] = {
            "index": ev.choice,
            "content": ev.text,
            "tokens": list(ev.tokens),
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": n_predicted,
            "tokens_evaluated": 0,
        }
        if ev.timings is not None and self.params.timings_per_token:
            obj["timings"] = timings_json(ev.timings)
        if self.params.logprobs is not None:
            obj["completion_probabilities"] = probabilities_json(ev.logprobs)
        return sse.event(_json.encode(obj))

    def final(
        self, content: str, tokens: list[int], last: Finish, prompt: str, index: int = 0,
        logprobs: Sequence[TokenLogprob] = (),
    ) -> dict[str, Any]:
        """The whole answer, or a stream's last event: `stop: true`, why it stopped, counts
        and timings. `index`: which of the request's prompts it answers."""
        usage = last.usage
        stop_type: StopType = last.stop_type or ("limit" if last.reason == "length" else "eos")
        out = {
            "index": index,
            "content": content,
            "tokens": tokens if (self.return_tokens or self.stream) else [],
            "id_slot": -1 if last.id_slot is None else last.id_slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": usage.completion_tokens,
            "tokens_evaluated": usage.prompt_tokens,
            "generation_settings": self.settings(),
            "prompt": prompt,
            "has_new_line": "\n" in content,
            # Generation ran into the context's end (not a token limit the client set).
            # (n_ctx 0: not known, an upstream's)
            "truncated": stop_type == "limit" and 0 < self.n_ctx <= usage.prompt_tokens + usage.completion_tokens,
            "stop_type": stop_type,
            "stopping_word": last.stopping_word,
            "tokens_cached": usage.cached_tokens,
            "timings": timings_json(last.timings),
        }
        if self.params.logprobs is not None:
            out["completion_probabilities"] = probabilities_json(logprobs)
        return pick_fields(out, self.response_fields) if self.response_fields else out


def probabilities_json(logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """n_probs' `completion_probabilities`, as llama-server shapes them: each token with
    its logprob and its n most likely alternatives (the model's, before sampling)."""
    return [
        {**_candidate(lp.token, lp.piece, lp.logprob), "top_logprobs": [_candidate(t.token, t.piece, t.logprob) for t in lp.top]}
        for lp in logprobs
    ]


def _candidate(token: int, piece: bytes, logprob: float) -> dict[str, Any]:
    return {"id": token, "token": piece.decode("utf-8", errors="replace"), "bytes": list(piece), "logprob": logprob}


def pick_fields(obj: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama-server's `response_fields`: only the named fields; a path "a/b" takes the
    nested field b of a and names it b. A field that is not there is left out."""
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = obj
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path.rsplit("/", 1)[-1]] = value
    return out


def props_json(file: str, alias: str, ready: Ready, slots: int, defaults: SamplingParams) -> dict[str, Any]:
    """GET /props for one model; `defaults`: what a request that sets nothing gets.
    `model_path` is the GGUF's file name, without its folders: what a client shows as the
    model, and nothing of the machine's layout."""
    return {
        "default_generation_settings": _slot_json(
            SlotState(id=0, n_ctx=ready.n_ctx_slot, is_processing=False), defaults
        ),
        "total_slots": slots,
        "model_alias": alias,
        "model_path": file,
        "chat_template": ready.chat_template,
        "chat_template_caps": {},
        "bos_token": ready.bos_token,
        "eos_token": ready.eos_token,
        "modalities": {"vision": ready.vision, "audio": ready.audio},
        # Where /completion's multimodal_data go in a prompt_string. llama-server draws a
        # random one per process unless LLAMA_MEDIA_MARKER pins it; Corral's is fixed, and a
        # prompt whose markers do not match its images one for one is a 400.
        "media_marker": LLAMA_MEDIA_MARKER,
        "build_info": ready.build_info or "corral",
        "is_sleeping": False,
    }


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def router_props_json(config: Config) -> dict[str, Any]:
    """GET /props without a model where none is the default: llama-server's router mode
    answers for itself (server-models.cpp), its model fields empty."""
    return {
        "role": "router",
        "max_instances": config.supervisor.max_loaded_models,
        "models_autoload": config.server.models_autoload,
        "model_alias": "corral",
        "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0},
        "build_info": f"corral (llama-cpp-python {_package_version('llama-cpp-python')})",
        "cors_proxy_enabled": False,
    }


def slots_json(states: list[SlotState], private: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    """GET /slots: each slot as llama-server shows it. An idle slot is its id, context and
    state alone, as llama-server shows a slot with no task (server-context.cpp,
    server_slot::to_json); so is a busy slot in `private` (its request is another key's),
    but for `is_processing`: nothing of the request (task id, parameters, progress)."""
    return [
        _slot_json(s, s.params or SamplingParams())
        if (s.params is not None or s.is_processing) and s.id not in private
        else {"id": s.id, "n_ctx": s.n_ctx, "speculative": False, "is_processing": s.is_processing}
        for s in states
    ]


def _slot_json(s: SlotState, params: SamplingParams) -> dict[str, Any]:
    return {
        "id": s.id,
        "id_task": s.id_task,
        "n_ctx": s.n_ctx,
        "speculative": False,
        "is_processing": s.is_processing,
        "params": params_json(params),
        "prompt": "",
        "next_token": {
            "has_next_token": s.is_processing,
            "has_new_line": False,
            "n_remain": s.n_remain,
            "n_decoded": s.n_decoded,
            "stopping_word": "",
        },
    }


def encode(obj: object) -> bytes:
    return _json.encode(obj)
