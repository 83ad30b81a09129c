"""The chat template a model loads with: the config's (a built-in's name or a Jinja file), else
the one in its GGUF; and the BOS and EOS texts a Jinja template is given."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from worker.chat_template import BuiltinTemplate, ChatTemplate, JinjaTemplate, builtin_names
from worker.load_error import LoadError
from worker.protocol import WorkerSpec


def model_template(
    spec: WorkerSpec, model: llama_cpp.llama_model_p, vocab: llama_cpp.llama_vocab_p
) -> tuple[ChatTemplate | None, str]:
    """The chat template, and its source as GET /props shows it: the Jinja text, or a
    built-in's name (never the path of a template file)."""
    if spec.chat_template is not None:
        if spec.chat_template in builtin_names():
            return BuiltinTemplate(spec.chat_template, spec.tool_format), spec.chat_template
        try:
            source = Path(spec.chat_template).read_text(encoding="utf-8")
        except OSError as exc:
            raise LoadError(
                f"the chat template file cannot be read ({exc.strerror or type(exc).__name__})",
                f"cannot read chat template {spec.chat_template}: {exc}",
            ) from exc
        return JinjaTemplate(source, *bos_eos(vocab), spec.tool_format, spec.reasoning, spec.chat_template_kwargs), source
    raw = llama_cpp.llama_model_chat_template(model, None)
    if not raw:
        return None, ""
    text = raw.decode("utf-8", errors="replace")
    try:
        return JinjaTemplate(text, *bos_eos(vocab), spec.tool_format, spec.reasoning, spec.chat_template_kwargs), text
    except ValueError as exc:
        raise LoadError(str(exc)) from exc


def bos_eos(vocab: llama_cpp.llama_vocab_p) -> tuple[str, str]:
    def text(tok: int) -> str:
        if tok < 0:
            return ""
        buf = ctypes.create_string_buffer(128)
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, 128, 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    return text(llama_cpp.llama_vocab_bos(vocab)), text(llama_cpp.llama_vocab_eos(vocab))
