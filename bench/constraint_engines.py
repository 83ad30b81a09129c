"""Which constrained-decoding engine for structured output: llama.cpp's grammar sampler or
llguidance? Measured on the demo model (262k-token vocabulary), in one process, one run.

  python -m bench.constraint_engines [--model PATH] [--requests 6] [--tokens 96]

The same JSON schema is enforced three ways, each generating greedily from the same prompt:

- `llguidance`: LLMatcher over a tokenizer built once from the llama.cpp vocabulary; per token
  fill the 262k-bit mask, apply it to the logits buffer in place (numpy), argmax, consume.
- `llama-full`: llama.cpp's grammar sampler (GBNF from llama-cpp-python's
  json_schema_to_gbnf) in a chain ending in greedy; llama_sampler_sample applies the grammar
  to the full vocabulary every token.
- `llama-check-first`: llama-server's trick: sample unconstrained, ask the grammar about that
  one token, and apply the grammar to the full vocabulary only when it is rejected.

Reported: the per-token cost of constraining and sampling (decode excluded), the cost of
building each engine's state (tokenizer, grammar), and whole-request throughput (decode
included) against unconstrained greedy. Results go to bench/results/constraint_engines.json
and .md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import llama_cpp
import llguidance
import llguidance.llamacpp
import numpy as np
from llama_cpp.llama_grammar import json_schema_to_gbnf

from bench.charts import write_chart
from worker.batch import BatchBuffer
from worker.constraint import Matcher, compile_constraint, tokenizer_for
from worker.model import LoadedModel, load
from worker.protocol import Constraint, WorkerSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "models" / "gemma-3-270m-Q4_K_M.gguf"
OUT = ROOT / "bench" / "results"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "hobbies", "employed"],
    "additionalProperties": False,
}
PROMPT = (
    "<start_of_turn>user\nDescribe a fictional person as JSON with name, age, city, hobbies and "
    "employed.<end_of_turn>\n<start_of_turn>model\n"
)

# llama_token_data as numpy sees it: {int32 id; float logit; float p}.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class Stepper:
    """One engine: choose the next token from the logits at batch index `idx`."""

    name = ""

    def start(self) -> None: ...

    def next(self, ctx: llama_cpp.llama_context_p, idx: int) -> int:
        raise NotImplementedError

    def done(self) -> bool:
        return False


class Unconstrained(Stepper):
    name = "unconstrained"

    def __init__(self, m: LoadedModel) -> None:
        self.n_vocab = m.n_vocab

    def next(self, ctx: llama_cpp.llama_context_p, idx: int) -> int:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, idx), shape=(self.n_vocab,))
        return int(np.argmax(logits))


class Guidance(Stepper):
    name = "llguidance"

    def __init__(self, m: LoadedModel, tokenizer: llguidance.LLTokenizer, grammar: str) -> None:
        self.m, self.tokenizer, self.grammar = m, tokenizer, grammar
        self.matcher: Matcher | None = None
        self.apply_s = 0.0  # mask fill and apply, all tokens
        self.applied = 0

    def start(self) -> None:
        self.matcher = Matcher(llguidance.LLMatcher(self.tokenizer, self.grammar), self.m.n_vocab)

    def next(self, ctx: llama_cpp.llama_context_p, idx: int) -> int:
        assert self.matcher is not None
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, idx), shape=(self.m.n_vocab,))
        t0 = time.perf_counter()
        self.matcher.apply(logits)
        self.apply_s += time.perf_counter() - t0
        self.applied += 1
        tok = int(np.argmax(logits))
        self.matcher.consume(tok)
        return tok

    def done(self) -> bool:
        assert self.matcher is not None
        return self.matcher.stopped


class LlamaFull(Stepper):
    name = "llama-full"

    def __init__(self, m: LoadedModel, gbnf: str) -> None:
        self.m, self.gbnf = m, gbnf
        self.chain: llama_cpp.llama_sampler_p | None = None

    def start(self) -> None:
        if self.chain is not None:
            llama_cpp.llama_sampler_free(self.chain)
        self.chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        g = llama_cpp.llama_sampler_init_grammar(self.m.vocab, self.gbnf.encode(), b"root")
        assert g, "GBNF did not compile"
        llama_cpp.llama_sampler_chain_add(self.chain, g)
        llama_cpp.llama_sampler_chain_add(self.chain, llama_cpp.llama_sampler_init_greedy())

    def next(self, ctx: llama_cpp.llama_context_p, idx: int) -> int:
        return int(llama_cpp.llama_sampler_sample(self.chain, ctx, idx))


class LlamaCheckFirst(Stepper):
    """llama-server's common_sampler_sample with grammar_first = false."""

    name = "llama-check-first"

    def __init__(self, m: LoadedModel, gbnf: str) -> None:
        self.m, self.gbnf = m, gbnf
        self.grammar: llama_cpp.llama_sampler_p | None = None
        self.full = np.zeros(m.n_vocab, dtype=TOKEN_DATA)
        self.full["id"] = np.arange(m.n_vocab, dtype=np.int32)
        self.one = np.zeros(1, dtype=TOKEN_DATA)
        self.rejected = 0  # sampled tokens the grammar refused: each cost a full pass
        self.checked = 0

    def start(self) -> None:
        if self.grammar is not None:
            llama_cpp.llama_sampler_free(self.grammar)
        self.grammar = llama_cpp.llama_sampler_init_grammar(self.m.vocab, self.gbnf.encode(), b"root")

    def _apply(self, arr: np.ndarray) -> None:
        cur = llama_cpp.llama_token_data_array(
            data=ctypes.cast(arr.ctypes.data, llama_cpp.llama_token_data_p), size=len(arr), selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(cur))

    def next(self, ctx: llama_cpp.llama_context_p, idx: int) -> int:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, idx), shape=(self.m.n_vocab,))
        tok = int(np.argmax(logits))
        self.checked += 1
        self.one["id"], self.one["logit"] = tok, logits[tok]
        self._apply(self.one)
        if not np.isfinite(self.one["logit"][0]):
            self.rejected += 1
            self.full["logit"] = logits
            self._apply(self.full)
            tok = int(np.argmax(self.full["logit"]))
        llama_cpp.llama_sampler_accept(self.grammar, tok)
        return tok


def generate(m: LoadedModel, batch: BatchBuffer, prompt: list[int], step: Stepper, max_new: int) -> tuple[list[int], float, float]:
    """Greedy generation of at most `max_new` tokens. Returns (tokens, seconds choosing
    tokens, seconds from the first sampled token on). The prompt's prefill is left out of
    the second figure: engines stop after different numbers of tokens, and a prefill spread
    over fewer tokens would otherwise count against the engine that stops sooner."""
    llama_cpp.llama_memory_clear(m.memory, True)
    step.start()
    batch.clear()
    batch.add(prompt, 0, 0, "last")
    assert llama_cpp.llama_decode(m.ctx, batch.struct()) == 0
    t_all = time.perf_counter()
    idx, pos, out, choosing = len(prompt) - 1, len(prompt), [], 0.0
    for _ in range(max_new):
        t0 = time.perf_counter()
        tok = step.next(m.ctx, idx)
        choosing += time.perf_counter() - t0
        if m.is_eog(tok):
            break
        out.append(tok)
        if step.done():
            break
        batch.clear()
        batch.add([tok], pos, 0, "last")
        assert llama_cpp.llama_decode(m.ctx, batch.struct()) == 0
        idx, pos = 0, pos + 1
    return out, choosing, time.perf_counter() - t_all


def timed(f: Callable[[], object]) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    # One decode thread by default: on a shared 2-core machine, two spinning ggml threads
    # with one descheduled turn a 25 ms step into a second.
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    m = load(WorkerSpec(name="bench", path=a.model, slots=1, n_ctx=2048, threads=a.threads), lambda p: None)
    batch = BatchBuffer(m.n_batch)
    prompt = m.tokenize(PROMPT)
    schema_text = json.dumps(SCHEMA)

    tokenizer, t_tok = timed(lambda: tokenizer_for(m.vocab, m.n_vocab, m.is_eog))
    assert isinstance(tokenizer, llguidance.LLTokenizer)
    grammar, t_gram = timed(lambda: compile_constraint(tokenizer, Constraint("json_schema", schema_text, "json_schema")))
    assert isinstance(grammar, str)
    _, t_matcher = timed(lambda: llguidance.LLMatcher(tokenizer, grammar))
    gbnf = json_schema_to_gbnf(schema_text)
    _, t_gbnf = timed(lambda: llama_cpp.llama_sampler_free(llama_cpp.llama_sampler_init_grammar(m.vocab, gbnf.encode(), b"root")))

    steppers: list[Stepper] = [Unconstrained(m), Guidance(m, tokenizer, grammar), LlamaFull(m, gbnf), LlamaCheckFirst(m, gbnf)]
    rows: dict[str, dict[str, float | str]] = {}
    for s in steppers:
        generate(m, batch, prompt, s, 8)  # warm up
        per_token, tps, n_tokens = [], [], 0
        text = ""
        for _ in range(a.requests):
            out, choosing, total = generate(m, batch, prompt, s, a.tokens)
            per_token.append(choosing / max(len(out), 1))
            tps.append(len(out) / total)
            n_tokens += len(out)
            text = b"".join(m.piece(t) for t in out).decode("utf-8", "replace")
        valid = s.name == "unconstrained"
        if not valid:
            try:
                json.loads(text)
                valid = True
            except ValueError:
                valid = False
        rows[s.name] = {
            "choose_ms_per_token": statistics.median(per_token) * 1e3,
            "gen_tok_s": statistics.median(tps),
            "tokens_per_request": n_tokens / a.requests,
            "output_parses": str(valid),
            "sample_output": text[:200],
        }
        print(f"{s.name:<18} choose {rows[s.name]['choose_ms_per_token']:7.3f} ms/token  "
              f"generating {rows[s.name]['gen_tok_s']:6.1f} tok/s  ({n_tokens / a.requests:.0f} tok/request, parses={valid})",
              flush=True)
    g = next(x for x in steppers if isinstance(x, Guidance))
    cf = next(x for x in steppers if isinstance(x, LlamaCheckFirst))
    base = float(rows["unconstrained"]["gen_tok_s"])
    result = {
        "machine": platform.processor() or platform.machine(),
        "model": Path(a.model).name,
        "n_vocab": m.n_vocab,
        "threads": a.threads,
        "schema": SCHEMA,
        "setup_s": {"llguidance_tokenizer": t_tok, "llguidance_grammar": t_gram, "llguidance_matcher": t_matcher, "llama_grammar_init": t_gbnf},
        "engines": rows,
        "llguidance_mask_ms_per_token": g.apply_s / max(g.applied, 1) * 1e3,
        "check_first_rejected_fraction": cf.rejected / max(cf.checked, 1),
        "throughput_vs_unconstrained": {k: float(v["gen_tok_s"]) / base for k, v in rows.items()},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "constraint_engines.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# Constrained decoding engines on the demo model (same run)", "",
        f"Model {result['model']}, vocabulary {m.n_vocab}, greedy, {a.requests} requests of at most {a.tokens} tokens.", "",
        f"Setup: llguidance tokenizer {t_tok:.2f} s (once per model), schema to grammar {t_gram * 1e3:.1f} ms, "
        f"matcher {t_matcher * 1e3:.1f} ms; llama.cpp grammar init {t_gbnf * 1e3:.1f} ms.", "",
        f"llguidance: filling and applying the mask costs {result['llguidance_mask_ms_per_token']:.3f} ms a token "
        "(of its constrain+sample figure below).", "",
        f"llama-check-first: the grammar refused the unconstrained choice for "
        f"{result['check_first_rejected_fraction']:.0%} of tokens, each then costing a full pass.", "",
        "| engine | constrain+sample ms/token | generation tok/s (decode included, prefill not) | vs unconstrained | output parses |",
        "|---|---|---|---|---|",
    ]
    for k, v in rows.items():
        md.append(f"| {k} | {float(v['choose_ms_per_token']):.3f} | {float(v['gen_tok_s']):.1f} | "
                  f"{result['throughput_vs_unconstrained'][k]:.2f}x | {v['output_parses']} |")
    (OUT / "constraint_engines.md").write_text("\n".join(md) + "\n")
    write_chart(OUT / "constraint_engines.json")
    print("\n".join(md))


if __name__ == "__main__":
    main()
