"""Loading a GGUF into a model and a context, and the vocabulary helpers the engine needs.

Everything here calls llama.cpp's low-level API through ctypes. The helpers size their
buffers from llama.cpp's own "-needed" answers instead of trusting fixed sizes: gemma's
pieces run to 48 bytes, and llama-cpp-python's own helper silently truncates at 32.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import llama_cpp

from worker import chat_formats
from worker.adapters import load_adapters
from worker.chat_template import BuiltinTemplate, ChatTemplate
from worker.fim_tokens import FimTokens
from worker.kv_rules import Attention
from worker.llama_log import collecting, quiet_llama_logs
from worker.load_error import LoadError
from worker.load_log import KvCache
from worker.load_params import OptionError, context_options, mlock_warning, model_params
from worker.model_template import bos_eos, model_template
from worker.protocol import WorkerSpec, sequences
from worker.protocol.load_options import LoadOptions
from worker.text_limits import RerankShape

_POOLING = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}


__all__ = ["LoadError", "LoadedModel", "load", "model_attention"]  # LoadError: worker/load_error.py

log = logging.getLogger("worker.model")


@dataclass
class LoadedModel:
    model: llama_cpp.llama_model_p
    ctx: llama_cpp.llama_context_p
    vocab: llama_cpp.llama_vocab_p
    n_ctx: int
    n_batch: int
    n_seq_max: int  # the slots' sequences, then the cached prompts' (worker/kv_entries.py)
    n_slots: int
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    template: ChatTemplate | None
    description: str
    pooling: str | None = None  # embedding models: the pooling in effect
    token_bytes: int | None = None  # the length bound's unit; None: no bound holds
    # What GET /props shows: the template's source (Jinja text or a built-in's name) and
    # the BOS/EOS texts.
    template_source: str = ""
    bos_text: str = ""
    eos_text: str = ""
    # What a sequence's KV cells must hold (worker/kv_rules.py).
    attention: Attention = field(default_factory=Attention)
    n_cls_out: int = 1  # a reranker's scores per input
    fim: FimTokens = field(default_factory=FimTokens)  # llama-server's /infill
    # How it was loaded (worker/protocol/load_options.py): every context whose cells are
    # copied into this one's takes the same context options (worker/media/beside.py).
    options: LoadOptions = field(default_factory=LoadOptions)
    threads_batch: int | None = None  # prompt batches' threads, when set apart from `threads`
    # What llama.cpp said it allocated: the KV caches at their types, and the tensors an
    # override_tensor or cpu_moe moved (worker/load_log.py).
    kv_caches: list[KvCache] = field(default_factory=list)
    overridden: list[tuple[str, str]] = field(default_factory=list)
    device_bytes: dict[str, int] = field(default_factory=dict)  # what each GPU holds (Ready)
    adapters: list[Any] = field(default_factory=list)  # LoRA adapters, as spec.lora lists them (worker/adapters.py)

    def __post_init__(self) -> None:
        self._pieces: dict[int, bytes] = {}
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.bos_id: int | None = int(llama_cpp.llama_vocab_bos(self.vocab)) if self.add_bos else None
        self._preserved = self._preserved_tokens()

    def _preserved_tokens(self) -> frozenset[int]:
        """Special tokens that render as their text, not as nothing: the markers the router
        parses tool calls and reasoning by (Mistral's [TOOL_CALLS], Llama's <|python_tag|>,
        Qwen 3's <think>), as llama-server's preserved tokens do."""
        fmt = self.template.format if self.template is not None else None
        if fmt is None or (fmt.tools is None and not fmt.reasoning):
            return frozenset()
        ids = (self.tokenize(m, add_special=False, parse_special=True) for m in chat_formats.PRESERVED_MARKERS)
        return frozenset(t[0] for t in ids if len(t) == 1)

    @property
    def threads(self) -> int:
        return int(llama_cpp.llama_n_threads(self.ctx))

    def set_threads(self, n: int) -> None:
        """Threads for every later decode (prompt batches: threads_batch, when set). Only
        between decodes: the engine thread calls it."""
        llama_cpp.llama_set_n_threads(self.ctx, n, self.threads_batch or n)

    # ---- vocabulary ---------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8", errors="replace")
        cap = len(data) + 8
        for _ in range(2):
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buf, cap, add_special, parse_special
            )
            if n >= 0:
                return list(buf[:n])
            cap = -n
        raise RuntimeError("llama_tokenize kept asking for a larger buffer")

    def piece(self, token: int) -> bytes:
        """The bytes of one token as generated text (special tokens render as nothing,
        except the preserved markers of this model's chat format)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        cap = 64
        special = token in self._preserved
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, cap, 0, special)
            if n >= 0:
                out = buf.raw[:n]
                self._pieces[token] = out
                return out
            cap = -n
        raise RuntimeError("llama_token_to_piece kept asking for a larger buffer")

    def token_text(self, token: int) -> bytes:
        """One token's bytes with special tokens written out (/tokenize's pieces). The
        caller has checked the id against n_vocab."""
        cap = 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, cap, 0, True)
            if n >= 0:
                return buf.raw[:n]
            cap = -n
        raise RuntimeError("llama_token_to_piece kept asking for a larger buffer")

    def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens`, special tokens written out and none removed, as
        llama-server's /detokenize. The caller has checked every id against n_vocab."""
        if not tokens:
            return ""
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        cap = len(tokens) * 8 + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            cap = -n
        raise RuntimeError("llama_detokenize kept asking for a larger buffer")

    def output_text(self, tokens: list[int]) -> str:
        """The text of a token prompt as output writes it (special tokens render as
        nothing): what `echo` prepends."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    @property
    def rerank_shape(self) -> RerankShape:
        """How a query and a document make one input of this model as a reranker: its
        GGUF's "rerank" template, or the special tokens its vocabulary adds
        (format_prompt_rerank in llama-server's server-common.cpp)."""
        template = llama_cpp.llama_model_chat_template(self.model, b"rerank")
        if template:
            return RerankShape(template=template.decode("utf-8", errors="replace"))
        v = self.vocab
        eos = int(llama_cpp.llama_vocab_eos(v))
        if eos == llama_cpp.LLAMA_TOKEN_NULL:
            eos = int(llama_cpp.llama_vocab_sep(v))
        return RerankShape(
            bos=int(llama_cpp.llama_vocab_bos(v)) if llama_cpp.llama_vocab_get_add_bos(v) else None,
            eos=eos if llama_cpp.llama_vocab_get_add_eos(v) else None,
            sep=int(llama_cpp.llama_vocab_sep(v)) if llama_cpp.llama_vocab_get_add_sep(v) else None,
        )

    def max_token_bytes(self) -> int | None:
        """The most bytes of input text one token can cover (see `_longest_token`)."""
        return self.token_bytes

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        """Free the model in a process that lives on (a test that loads it in-process);
        a worker never needs this, since it frees the model by exiting."""
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def _meta(model: llama_cpp.llama_model_p, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, 256)
    if n < 0:
        return None
    if n >= 256:
        buf = ctypes.create_string_buffer(n + 1)
        llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, n + 1)
    return buf.value.decode("utf-8", errors="replace")


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def load(spec: WorkerSpec, progress: Callable[[float], None]) -> LoadedModel:
    """Load the GGUF and create its context. Raises LoadError with a message for the user."""
    quiet_llama_logs()
    llama_cpp.llama_backend_init()
    if not Path(spec.path).is_file():
        raise LoadError("the model file does not exist", f"model file not found: {spec.path}")
    try:
        params = model_params(spec, spec.n_gpu_layers, spec.repack)
    except OptionError as exc:
        raise LoadError(str(exc)) from None
    mparams = params.model
    if (why := mlock_warning(spec, Path(spec.path).stat().st_size)) is not None:
        log.warning("%s", why)

    def on_progress(p: float, _user: ctypes.c_void_p) -> bool:
        progress(float(p))
        return True  # False would abort the load

    # Keep the ctypes callback referenced for as long as llama.cpp may call it.
    cb = llama_cpp.llama_progress_callback(on_progress)
    mparams.progress_callback = cb
    with collecting() as said:
        model = llama_cpp.llama_model_load_from_file(spec.path.encode(), mparams)
    if not model:
        why = said.why() or "not a valid GGUF?"
        # The client's message names no local path (LoadError); llama.cpp's may.
        told = why.replace(spec.path, "the model file").replace(str(Path(spec.path).parent), "the models' folder")
        raise LoadError(f"llama.cpp could not load the model file ({told})", f"llama.cpp could not load {spec.path}: {why}")

    try:
        adapters = load_adapters(model, spec.lora)
    except LoadError:
        llama_cpp.llama_model_free(model)
        raise
    vocab = llama_cpp.llama_model_get_vocab(model)
    threads = spec.threads or default_threads()
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = spec.n_ctx
    cparams.n_seq_max = sequences(spec)
    cparams.n_threads = threads
    cparams.n_threads_batch = spec.threads_batch or threads
    cparams.kv_unified = True
    cparams.swa_full = spec.swa_full
    context_options(cparams, spec)
    pooling = None
    if spec.embeddings:
        # Non-causal models need a whole input in one ubatch.
        cparams.n_batch = cparams.n_ubatch = min(spec.n_batch, spec.n_ctx)
        cparams.embeddings = True
        pooling = spec.pooling or _model_pooling(model)
        cparams.pooling_type = _POOLING[pooling]
    else:
        cparams.n_batch = min(spec.n_batch, spec.n_ctx)
        cparams.n_ubatch = min(cparams.n_batch, spec.n_ubatch or 512)
    if cparams.n_batch < cparams.n_seq_max:  # llama.cpp would abort the process (output_reserve)
        llama_cpp.llama_model_free(model)
        raise LoadError(f"n_batch ({cparams.n_batch}) must be at least the model's sequences ({cparams.n_seq_max})")
    with collecting() as made:
        ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        llama_cpp.llama_model_free(model)
        # llama.cpp's own reason when it gave one: "quantized V cache requires flash_attn",
        # a K type whose blocks do not divide the heads, a buffer it could not allocate.
        raise LoadError(f"llama.cpp could not create a context ({made.why() or 'n_ctx too large for memory?'})")
    if said.overridden:
        log.info("%d tensors placed by override_tensor/cpu_moe, e.g. %s on %s", len(said.overridden), *said.overridden[0])
    for cache in made.caches:
        log.info("KV cache: %d cells, K %s %.1f MiB, V %s %.1f MiB", cache.cells, cache.type_k,
                 cache.k_bytes / 2**20, cache.type_v, cache.v_bytes / 2**20)

    template, template_source = model_template(spec, model, vocab)
    if template is not None and template.format.tools == "generic" and spec.tool_format == "auto":
        # Said once, at load: requests with tools get a system message describing them and
        # are asked for a JSON reply, which a model not trained for it follows less well.
        which = f"built-in {template_source!r}" if isinstance(template, BuiltinTemplate) else "Jinja"
        log.info(
            "the %s chat template has no tool-call format of its own: tools are offered in the "
            "generic JSON format (set tool_format to choose another)", which,
        )
    bos_text, eos_text = bos_eos(vocab)
    desc = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(model, desc, 256)
    return LoadedModel(
        model=model,
        ctx=ctx,
        vocab=vocab,
        # Read back what llama.cpp actually gave us: it pads and clamps.
        n_ctx=int(llama_cpp.llama_n_ctx(ctx)),
        n_batch=int(llama_cpp.llama_n_batch(ctx)),
        n_seq_max=int(llama_cpp.llama_n_seq_max(ctx)),
        n_slots=min(spec.slots, int(llama_cpp.llama_n_seq_max(ctx))),
        n_vocab=int(llama_cpp.llama_vocab_n_tokens(vocab)),
        n_ctx_train=int(llama_cpp.llama_model_n_ctx_train(model)),
        n_embd=int(llama_cpp.llama_model_n_embd(model)),
        template=template,
        description=desc.value.decode("utf-8", errors="replace"),
        pooling=pooling,
        token_bytes=_longest_token(vocab),
        template_source=template_source,
        bos_text=bos_text,
        eos_text=eos_text,
        attention=model_attention(model),
        n_cls_out=max(1, int(llama_cpp.llama_model_n_cls_out(model))),
        options=spec,
        threads_batch=spec.threads_batch,
        kv_caches=made.caches,
        adapters=adapters,
        overridden=said.overridden,
        device_bytes={d: said.device_bytes.get(d, 0) + made.device_bytes.get(d, 0) for d in {**said.device_bytes, **made.device_bytes}},
        fim=FimTokens(
            pre=int(llama_cpp.llama_vocab_fim_pre(vocab)),
            suf=int(llama_cpp.llama_vocab_fim_suf(vocab)),
            mid=int(llama_cpp.llama_vocab_fim_mid(vocab)),
            rep=int(llama_cpp.llama_vocab_fim_rep(vocab)),
            sep=int(llama_cpp.llama_vocab_fim_sep(vocab)),
        ),
    )


def model_attention(model: llama_cpp.llama_model_p) -> Attention:
    """How far back the model's layers look (worker/kv_rules.py). llama.cpp's API gives the
    window's size and whether the memory is recurrent, not the window's kind: llama4 is the
    one generative architecture with a chunked window (src/models/llama4.cpp); the
    symmetric ones are embedding models, which keep no slot caches."""
    return Attention(
        n_swa=max(int(llama_cpp.llama_model_n_swa(model)), 0),
        chunked=_meta(model, "general.architecture") == "llama4",
        recurrent=bool(llama_cpp.llama_model_is_recurrent(model)) or bool(llama_cpp.llama_model_is_hybrid(model)),
        mrope=llama_cpp.llama_model_rope_type(model) in (llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_IMROPE),
    )


def _longest_token(vocab: llama_cpp.llama_vocab_p) -> int | None:
    """The most bytes of input text one token can cover: the bound that lets a text be
    refused by its length before it is tokenized (worker/prompts.py).

    A token's vocabulary text is at least as long as the text it matches: SPM writes a
    space as the 3-byte "▁", byte-level BPE writes a byte as 1 or 2 characters,
    byte-fallback tokens read "<0xAB>", and special tokens match their own text. Other
    tokenizers (WPM, UGM, ...) normalise their input, folding whitespace, so one token can
    cover more than its text: no bound for them. About 0.17 s for a 262k vocabulary.
    """
    if llama_cpp.llama_vocab_type(vocab) not in (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE):
        return None
    text = llama_cpp.llama_vocab_get_text
    n = int(llama_cpp.llama_vocab_n_tokens(vocab))
    return max((len(text(vocab, t) or b"") for t in range(n)), default=0) or None


def _model_pooling(model: llama_cpp.llama_model_p) -> str:
    """The GGUF's declared pooling, or mean for models that declare none (decoder LLMs)."""
    arch = _meta(model, "general.architecture") or ""
    declared = _meta(model, f"{arch}.pooling_type")
    names = {str(v): k for k, v in _POOLING.items()}
    name = names.get(declared or "", "mean")
    return "mean" if name == "none" else name
