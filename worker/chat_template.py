"""Chat templates: the GGUF's own Jinja template, a Jinja file, or a llama.cpp built-in.

A Jinja template is rendered with Jinja2 in a sandbox, the way HF transformers and
llama-server --jinja render them: their `tojson`, loop controls, `raise_exception` and
`strftime_now`, with `tools` and the OpenAI tool-call fields of each message. Built-in
names ("gemma", "chatml", ...) go through `llama_chat_apply_template`, which is C++ code,
not Jinja, and cannot render tools.

A conversation that ends with an assistant message is continued, not answered (assistant
prefill, as llama-server does it): the messages before it are rendered with the generation
prompt, and its content is appended.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import types
from typing import Any, Protocol, Sequence

import jinja2
import jinja2.ext
import jinja2.meta
import llama_cpp
from jinja2.sandbox import ImmutableSandboxedEnvironment

from worker import chat_formats
from worker.chat_formats import ChatFormat
from worker.protocol import ChatMessage, utf8_length


class TemplateError(Exception):
    """The messages cannot be rendered (for example, roles the template refuses)."""


class TemplateTooLong(Exception):
    """The rendered prompt would be longer than the caller's limit."""

    def __init__(self, n_bytes: int) -> None:
        super().__init__(f"{n_bytes} bytes")
        self.n_bytes = n_bytes


class ChatTemplate(Protocol):
    @property
    def format(self) -> ChatFormat:
        """How this model writes tool calls and reasoning."""
        ...

    def render(
        self,
        messages: Sequence[ChatMessage],
        max_bytes: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text. Raises TemplateError, or TemplateTooLong when the text would
        be longer than `max_bytes` UTF-8 bytes, found as cheaply as the template allows.
        `tools` must be None unless `format.tools` is set. Without
        `add_generation_prompt`, the assistant's turn is not opened (and a final assistant
        message is rendered as a whole turn, not continued)."""
        ...


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' `tojson`: json.dumps without Jinja's HTML escaping, so a template
    writes `<` and `'` inside tool schemas as themselves."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys, default=_listed
    )


def _listed(value: Any) -> Any:
    """What Jinja's `map` and `select` give (generators) as the list they stand for, as
    minja (llama.cpp's Jinja) gives them: `tools | map(attribute='function') | tojson`."""
    if isinstance(value, (types.GeneratorType, map, filter)) or hasattr(value, "__next__"):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _message_dict(m: ChatMessage, object_arguments: bool, null_content: bool, thinking: bool = False) -> dict[str, Any]:
    """One message as a template reads it: only the keys the client sent, because
    templates test for them (`'tool_calls' in message`, `message.name is defined`)."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls is not None:
        if null_content and not m.content:
            d["content"] = None
        d["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": chat_formats.parse_arguments(c.arguments) if object_arguments else c.arguments,
                },
            }
            for c in m.tool_calls
        ]
    if m.name is not None:
        d["name"] = m.name
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None:
        d["reasoning_content"] = m.reasoning_content
        if thinking:  # GPT-OSS's template reads it as `thinking` (llama.cpp copies it so)
            d["thinking"] = m.reasoning_content
    return d


# Templates disagree on what a call's arguments and a call-only message's content are:
# most write `arguments | tojson` (an object), DeepSeek-R1's concatenates them as text, and
# its call-only messages must have `content is none` where Qwen 3's test `'x' in content`.
# Each shape is tried in turn until one renders (llama.cpp probes its templates likewise).
_SHAPES = ((True, True), (True, False), (False, True), (False, False))


def _today() -> dict[str, str]:
    """The dates llama-server gives every template (common/chat.cpp,
    common_chat_extra_context): Llama 3.x's `date_string` and Firefunction's `datetime`;
    without them those templates write a date of their own (26 Jul 2024)."""
    now = datetime.datetime.now()
    return {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y")}


class JinjaTemplate:
    def __init__(
        self,
        source: str,
        bos_token: str,
        eos_token: str,
        tool_format: str = "auto",
        reasoning: bool = True,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        try:
            self._tmpl = env.from_string(source)
            # Whether it shows the model the tools on offer at all: DeepSeek's templates
            # render calls and results but not the tools, which their model cards put in
            # the system message; Corral does that for them (chat_formats.tools_instructions).
            self._reads_tools = bool({"tools", "functions"} & jinja2.meta.find_undeclared_variables(env.parse(source)))
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self._bos, self._eos = bos_token, eos_token
        # The variables every render gets unless the request sets them: enable_thinking
        # is true, as llama-server's context always has it (common/chat.cpp), so that a
        # template written `if not enable_thinking` opens its <think> block by default;
        # then the model's config (chat_template_kwargs).
        self._defaults: dict[str, Any] = {"enable_thinking": True, **(defaults or {})}
        self._thinking_field = "message.thinking" in source
        self._format = chat_formats.resolve(tool_format, source, reasoning)
        # Whether the template takes a system message (gemma's refuse one): the generic
        # format's tool instructions go into the first user message where it does not.
        self._system_role = self._renders([ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u")])

    @property
    def format(self) -> ChatFormat:
        return self._format

    def _renders(self, messages: list[ChatMessage]) -> bool:
        try:
            self._tmpl.render(messages=[_message_dict(m, True, True) for m in messages], add_generation_prompt=True)
            return True
        except Exception:  # any failure, a raise_exception or a TypeError, means "no"
            return False

    def render(
        self,
        messages: Sequence[ChatMessage],
        max_bytes: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        offered = tools
        if self._format.tools == "generic" and chat_formats.needs_generic_rewrite(messages, tools):
            messages = chat_formats.generic_messages(messages, tools, self._system_role)
            offered = None  # the instructions are in the messages; the template never sees them
        elif tools and self._format.tools is not None and not self._reads_tools:
            text = chat_formats.tools_instructions(self._format.tools, tools)
            messages = chat_formats.with_system_text(messages, text, self._system_role)
        prefill = chat_formats.prefill_of(messages) if add_generation_prompt else None
        if prefill is not None:
            messages = messages[:-1]
        context: dict[str, Any] = {**_today(), **self._defaults, **(template_kwargs or {})}
        context.update(bos_token=self._bos, eos_token=self._eos, add_generation_prompt=add_generation_prompt)
        if offered:
            context["tools"] = list(offered)
        # Firefunction v2's template reads the tools as `functions`, JSON text, as
        # llama.cpp's handler for it gives them (common/chat.cpp); "" without tools.
        context.setdefault("functions", json.dumps(list(offered), indent=2) if offered else "")
        text = self._render_any_shape(messages, context, tools)
        if prefill is not None:
            text += prefill.content
        # Templates write the BOS text themselves, and tokenizing adds BOS again; drop one so
        # the prompt does not start with two (llama.cpp's common_chat does the same).
        if self._bos and text.startswith(self._bos):
            text = text[len(self._bos) :]
        if max_bytes is not None and (n := utf8_length(text)) > max_bytes:
            raise TemplateTooLong(n)
        return text

    def _render_any_shape(
        self, messages: Sequence[ChatMessage], context: dict[str, Any], tools: Sequence[dict[str, Any]] | None
    ) -> str:
        """The first shape that renders every call's name; else the first that renders. A
        name counts once it appears more often than the tools' descriptions name it, which
        the template (or the instructions Corral adds) may show as well."""
        first: Exception | None = None
        fallback: str | None = None
        names = {c.name for m in messages for c in m.tool_calls or ()}
        described = json.dumps(list(tools or ()), ensure_ascii=False)
        need = {n: 1 + described.count(n) for n in names}
        for object_arguments, null_content in _SHAPES if names else _SHAPES[:1]:
            try:
                text = self._tmpl.render(
                    messages=[_message_dict(m, object_arguments, null_content, self._thinking_field) for m in messages],
                    **context,
                )
            except Exception as exc:  # a template is client-driven code: any failure is a 400
                first = first or exc
                continue
            if all(text.count(n) >= k for n, k in need.items()):
                return text
            fallback = text if fallback is None else fallback
        if fallback is not None:
            return fallback
        assert first is not None
        raise TemplateError(str(first) or type(first).__name__) from first


class BuiltinTemplate:
    def __init__(self, name: str, tool_format: str = "auto") -> None:
        self._name = name.encode()
        self._format = chat_formats.resolve(tool_format, None, False)

    @property
    def format(self) -> ChatFormat:
        return self._format

    def render(
        self,
        messages: Sequence[ChatMessage],
        max_bytes: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        # A built-in template takes tools only in the generic format, where they travel as
        # a system message; template_kwargs have no meaning for C++ templates.
        if self._format.tools == "generic" and chat_formats.needs_generic_rewrite(messages, tools):
            messages = chat_formats.generic_messages(messages, tools, system_role=True)
        elif any(m.role == "tool" or m.tool_calls for m in messages) or tools:
            raise TemplateError("this model's built-in chat template cannot render tool calls")
        prefill = chat_formats.prefill_of(messages) if add_generation_prompt else None
        if prefill is None:
            return self._apply(messages, max_bytes, add_generation_prompt)
        extra = utf8_length(prefill.content)
        try:
            text = self._apply(messages[:-1], None if max_bytes is None else max(0, max_bytes - extra))
        except TemplateTooLong as exc:
            raise TemplateTooLong(exc.n_bytes + extra) from None
        if max_bytes is not None and utf8_length(text) + extra > max_bytes:
            raise TemplateTooLong(utf8_length(text) + extra)
        return text + prefill.content

    def _apply(self, messages: Sequence[ChatMessage], max_bytes: int | None, add_ass: bool = True) -> str:
        # C strings end at NUL: drop any (the check is a fast scan; the copy is rare).
        contents = [(m.content.replace("\0", "") if "\0" in m.content else m.content).encode() for m in messages]
        roles = [m.role.encode() for m in messages]  # kept alive while C reads them
        arr = (llama_cpp.llama_chat_message * len(messages))()
        for i, (r, c) in enumerate(zip(roles, contents)):
            arr[i].role = r
            arr[i].content = c
        # A NULL buffer measures the text without copying it out: a prompt over the limit
        # is refused without building a Python string of it (the C call drops the GIL).
        n = llama_cpp.llama_chat_apply_template(self._name, arr, len(messages), add_ass, None, 0)
        if n < 0:
            raise TemplateError(f"built-in template {self._name.decode()!r} failed")
        if max_bytes is not None and n > max_bytes:
            raise TemplateTooLong(n)
        buf = ctypes.create_string_buffer(n + 1)
        n = llama_cpp.llama_chat_apply_template(self._name, arr, len(messages), add_ass, buf, n + 1)
        return ctypes.string_at(buf, n).decode("utf-8", errors="replace")


def _raise(message: str) -> None:
    raise TemplateError(message)


def builtin_names() -> list[str]:
    """The names llama.cpp's `llama_chat_apply_template` accepts."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return sorted(a.decode() for a in arr if a)
