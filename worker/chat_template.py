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

from worker.protocol import ChatMessage, utf8_length


class TemplateError(Exception):
    """The messages cannot be rendered (for example, roles the template refuses)."""


class TemplateTooLong(Exception):
    """The rendered prompt would be longer than the caller's limit."""

    def __init__(self, n_bytes: int) -> None:
        super().__init__(f"{n_bytes} bytes")
        self.n_bytes = n_bytes


class ChatTemplate(Protocol):
    def render(self, messages: Sequence[ChatMessage], max_bytes: int | None = None) -> str:
        """The prompt text. Raises TemplateError, or TemplateTooLong when the text would
        be longer than `max_bytes` UTF-8 bytes, found as cheaply as the template allows."""
        ...


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

    def render(self, messages: Sequence[ChatMessage], max_bytes: int | None = None) -> str:
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
        if max_bytes is not None and (n := utf8_length(text)) > max_bytes:
            raise TemplateTooLong(n)
        return text


class BuiltinTemplate:
    def __init__(self, name: str) -> None:
        self._name = name.encode()

    def render(self, messages: Sequence[ChatMessage], max_bytes: int | None = None) -> str:
        # C strings end at NUL: drop any (the check is a fast scan; the copy is rare).
        contents = [(m.content.replace("\0", "") if "\0" in m.content else m.content).encode() for m in messages]
        roles = [m.role.encode() for m in messages]  # kept alive while C reads them
        arr = (llama_cpp.llama_chat_message * len(messages))()
        for i, (r, c) in enumerate(zip(roles, contents)):
            arr[i].role = r
            arr[i].content = c
        # A NULL buffer measures the text without copying it out: a prompt over the limit
        # is refused without building a Python string of it (the C call drops the GIL).
        n = llama_cpp.llama_chat_apply_template(self._name, arr, len(messages), True, None, 0)
        if n < 0:
            raise TemplateError(f"built-in template {self._name.decode()!r} failed")
        if max_bytes is not None and n > max_bytes:
            raise TemplateTooLong(n)
        buf = ctypes.create_string_buffer(n + 1)
        n = llama_cpp.llama_chat_apply_template(self._name, arr, len(messages), True, buf, n + 1)
        return ctypes.string_at(buf, n).decode("utf-8", errors="replace")


def _raise(message: str) -> None:
    raise TemplateError(message)


def builtin_names() -> list[str]:
    """The names llama.cpp's `llama_chat_apply_template` accepts."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return sorted(a.decode() for a in arr if a)
