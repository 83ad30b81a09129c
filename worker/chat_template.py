"""Chat templates: the GGUF's own Jinja template, a Jinja file, or a llama.cpp built-in.

A Jinja template is rendered with Jinja2 in a sandbox, as llama-cpp-python's
Jinja2ChatFormatter does. Built-in names ("gemma", "chatml", ...) go through
`llama_chat_apply_template`, which is C++ code, not Jinja.
"""

from __future__ import annotations

import ctypes
import datetime
from typing import Protocol, Sequence

import jinja2
import llama_cpp
from jinja2.sandbox import ImmutableSandboxedEnvironment

from worker.protocol import ChatMessage


class TemplateError(Exception):
    """The messages cannot be rendered (for example, roles the template refuses)."""


class ChatTemplate(Protocol):
    def render(self, messages: Sequence[ChatMessage]) -> str: ...


class JinjaTemplate:
    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        try:
            self._tmpl = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self._bos, self._eos = bos_token, eos_token

    def render(self, messages: Sequence[ChatMessage]) -> str:
        try:
            text = self._tmpl.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                bos_token=self._bos,
                eos_token=self._eos,
                add_generation_prompt=True,
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(str(exc)) from exc
        # Templates write the BOS text themselves, and tokenizing adds BOS again; drop one so
        # the prompt does not start with two (llama.cpp's common_chat does the same).
        if self._bos and text.startswith(self._bos):
            text = text[len(self._bos) :]
        return text


class BuiltinTemplate:
    def __init__(self, name: str) -> None:
        self._name = name.encode()

    def render(self, messages: Sequence[ChatMessage]) -> str:
        # Keep the encoded strings alive while C reads them.
        roles = [m.role.encode() for m in messages]
        contents = [m.content.replace("\0", "").encode() for m in messages]
        arr = (llama_cpp.llama_chat_message * len(messages))()
        for i, (r, c) in enumerate(zip(roles, contents)):
            arr[i].role = r
            arr[i].content = c
        size = 2 * sum(len(c) + len(r) for r, c in zip(roles, contents)) + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(self._name, arr, len(messages), True, buf, size)
            if n < 0:
                raise TemplateError(f"built-in template {self._name.decode()!r} failed")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n + 1
        raise TemplateError("template output kept growing")


def _raise(message: str) -> None:
    raise TemplateError(message)


def builtin_names() -> list[str]:
    """The names llama.cpp's `llama_chat_apply_template` accepts."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return sorted(a.decode() for a in arr if a)
