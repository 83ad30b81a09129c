"""The Responses API's `input` items and `tools`, checked and turned into chat messages and
function tools: what the internal request holds (router/generation/job.py).

Items, in order:
- a message (`type` "message" or left out): `role` user, system, developer or assistant;
  `content` a string or parts (`input_text`, and `output_text` / `refusal` in an
  assistant's, as a client sends its earlier output back); `input_image` in a user's (its
  `image_url` a data URI: router/generation/media.py), which a vision model sees where it
  stands. Files need a file store, which Corral does not run: a 400 naming the part;
- `function_call` (call_id, name, arguments) and `reasoning` (its text, or its summary's)
  join the assistant turn they belong to, as its tool_calls and reasoning_content;
- `function_call_output` (call_id, output) is a `tool` message answering that call.
Any other item (a hosted tool's call, an `item_reference`) is refused naming its `type`.
"""

from __future__ import annotations

from typing import Any

from router.generation import media, tool_schemas
from router.generation.tool_schemas import ToolRequest
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import MEDIA_MARKER, ChatMessage, Media, ToolCall

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}


def _string(item: dict[str, Any], key: str, at: str, required: bool = True) -> str:
    v = item.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str):
        if v is None:
            raise InvalidRequest(f"Missing required parameter: '{at}.{key}'.", f"{at}.{key}")
        raise InvalidRequest(f"Invalid type for '{at}.{key}': expected a string.", f"{at}.{key}")
    return v


def _text(content: Any, at: str) -> str:
    """A string, or text parts joined; an image or a file is refused."""
    return _content(content, at, images=None)


def _content(content: Any, at: str, images: list[Media] | None) -> str:
    """A string, or its parts' texts joined, with a media marker for each `input_image`,
    whose bytes go to `images` (None: no image may stand here)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"Invalid type for '{at}': expected a string or an array of parts.", at)
    texts = []
    for j, part in enumerate(content):
        pat = f"{at}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and images is not None:
            if part.get("detail") is not None and part.get("detail") not in ("auto", "low", "high"):
                raise InvalidRequest(
                    f"Invalid value for '{pat}.detail': expected one of ['auto', 'low', 'high'].", f"{pat}.detail"
                )
            if part.get("file_id") is not None and part.get("image_url") is None:
                raise Unsupported(f"'{pat}.file_id': Corral keeps no files; send image_url as a data URI.", f"{pat}.file_id")
            images.append(media.from_url(part.get("image_url"), f"{pat}.image_url"))
            texts.append(MEDIA_MARKER)
            continue
        if kind in ("input_image", "input_file", "input_audio"):
            where = "here" if kind == "input_image" else "by Corral"
            raise Unsupported(f"'{pat}.type': {kind} parts are not supported {where}.", f"{pat}.type")
        if kind == "refusal":
            texts.append(_string(part, "refusal", pat))
        elif kind in _TEXT_PARTS:
            texts.append(_string(part, "text", pat))
        else:
            raise InvalidRequest(
                f"Invalid value for '{pat}.type': expected 'input_text' or 'output_text', got {kind!r}.", f"{pat}.type"
            )
    return "".join(texts)


class _Turns:
    """The messages being built: an assistant turn stays open while its reasoning, text and
    calls arrive, and closes at the next message or call output."""

    def __init__(self) -> None:
        self.out: list[ChatMessage] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []

    def close(self) -> None:
        if self.content or self.reasoning or self.calls:
            self.out.append(
                ChatMessage(
                    role="assistant",
                    content="".join(self.content),
                    tool_calls=self.calls or None,
                    reasoning_content="".join(self.reasoning) if self.reasoning else None,
                )
            )
        self.content, self.reasoning, self.calls = [], [], []

    def add(self, m: ChatMessage) -> None:
        self.close()
        self.out.append(m)


def chat_messages(input: str | list[Any] | None) -> list[ChatMessage]:
    """The input's turns; none for no input (a follow-up may add nothing to its
    predecessor's conversation but new instructions)."""
    if input is None:
        return []
    if isinstance(input, str):
        return [ChatMessage(role="user", content=input)]
    turns = _Turns()
    seen = 0  # images so far
    for i, item in enumerate(input):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"Invalid type for '{at}': expected an object.", at)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise InvalidRequest(f"Invalid value for '{at}.role': expected one of {list(_ROLES)}.", f"{at}.role")
            images: list[Media] = []
            text = _content(item.get("content"), f"{at}.content", images if role == "user" else None)
            seen += len(images)
            media.counted(seen, f"{at}.content")
            if role == "assistant":
                turns.content.append(text)
            else:  # "developer" is the system role's newer name; templates know "system"
                turns.add(ChatMessage(role="system" if role == "developer" else role, content=text, media=images or None))
        elif kind == "function_call":
            call_id, name = _string(item, "call_id", at), _string(item, "name", at)
            turns.calls.append(ToolCall(id=call_id, name=name, arguments=_string(item, "arguments", at)))
        elif kind == "function_call_output":
            output = item.get("output")
            shown: list[Media] = []  # a tool's output may show images (a screenshot)
            text = _content(output if output is not None else "", f"{at}.output", shown)
            seen += len(shown)
            media.counted(seen, f"{at}.output")
            turns.add(ChatMessage(role="tool", content=text, tool_call_id=_string(item, "call_id", at), media=shown or None))
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            turns.reasoning.append(_text(parts, f"{at}.content" if item.get("content") else f"{at}.summary"))
        else:
            raise Unsupported(
                f"Invalid value for '{at}.type': {kind!r} items are not supported; Corral takes messages, "
                "function_call, function_call_output and reasoning items.",
                f"{at}.type",
            )
    turns.close()
    if not turns.out:
        raise InvalidRequest("'input' must contain at least one item.", "input")
    return turns.out


_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def _function(t: dict[str, Any]) -> dict[str, Any]:
    """A flat Responses function tool in chat's layout, its keys in OpenAI's order (a
    template that renders tools as JSON writes the same text whichever API they came by)."""
    return {"type": "function", "function": {k: t[k] for k in _FUNCTION_KEYS if k in t}}


def _hosted(t: Any, at: str) -> Unsupported:
    kind = t.get("type") if isinstance(t, dict) else None
    return Unsupported(
        f"Invalid value for '{at}.type': {kind!r} tools are not supported; Corral serves function tools (the "
        "model's calls come back for the client to run), alone or in a namespace. This server refuses "
        '(hosted_tools = "refuse") where by default it would leave the tool out.',
        f"{at}.type",
    )


def _kind(t: Any) -> str:
    kind = t.get("type") if isinstance(t, dict) else None
    return kind if isinstance(kind, str) else repr(kind)


def served_tools(tools: list[Any] | None) -> tuple[list[Any] | None, list[str]]:
    """`tools` without the hosted ones (router/api/hosted_tools.py), a namespace's included,
    and the types left out, in order. Anything that is not an object is kept, for
    tool_request's 400; so is a namespace whose `tools` is not a list."""
    if not tools:
        return tools, []
    kept: list[Any] = []
    skipped: list[str] = []
    for t in tools:
        if not isinstance(t, dict) or t.get("type") == "function":
            kept.append(t)
        elif t.get("type") == "namespace" and isinstance(t.get("tools"), list):
            inner = [u for u in t["tools"] if isinstance(u, dict) and u.get("type") == "function"]
            skipped += [_kind(u) for u in t["tools"] if not (isinstance(u, dict) and u.get("type") == "function")]
            if inner:
                kept.append({**t, "tools": inner})
        elif t.get("type") == "namespace":
            kept.append(t)
        else:
            skipped.append(_kind(t))
    return kept, skipped


def tool_request(tools: list[Any] | None, tool_choice: Any, parallel: bool | None) -> tuple[ToolRequest, dict[str, str]]:
    """Function tools (name, description, parameters, strict: flat, unlike chat's), checked
    as chat's are, and the functions of each `namespace` tool (Codex groups its sub-agent
    tools in one), offered alongside; a hosted tool (web_search, file_search, ...) left in
    (hosted_tools = "refuse"; served_tools takes them out) is refused naming it. Also
    returns each namespaced function's namespace, which its calls carry back."""
    functions: list[dict[str, Any]] = []
    paths: list[str] = []  # where each function came from, for a 400
    namespaces: dict[str, str] = {}
    for i, t in enumerate(tools or ()):
        at = f"tools[{i}]"
        if not isinstance(t, dict):
            raise InvalidRequest(f"Invalid type for '{at}': expected an object.", at)
        if t.get("type") == "function":
            functions.append(_function(t))
            paths.append(at)
        elif t.get("type") == "namespace":
            if not isinstance(t.get("tools"), list):
                raise InvalidRequest(f"Invalid type for '{at}.tools': expected an array of function tools.", f"{at}.tools")
            for j, inner in enumerate(t["tools"]):
                if not isinstance(inner, dict) or inner.get("type") != "function":
                    raise _hosted(inner, f"{at}.tools[{j}]")
                functions.append(_function(inner))
                paths.append(f"{at}.tools[{j}]")
                if isinstance(inner.get("name"), str):
                    namespaces[inner["name"]] = str(t.get("name", ""))
        else:
            raise _hosted(t, at)
    choice = tool_choice
    if isinstance(tool_choice, dict):
        if tool_choice.get("type") != "function" or not isinstance(tool_choice.get("name"), str):
            raise Unsupported(
                "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
                '{"type": "function", "name": ...}.',
                "tool_choice",
            )
        choice = {"type": "function", "function": {"name": tool_choice["name"]}}
    try:
        return tool_schemas.tool_request(functions or None, choice, parallel), namespaces
    except InvalidRequest as exc:
        # Chat's layout names `tools[k].function.name`; a Responses tool is flat, and the
        # k-th function may sit in a namespace.
        param = exc.param
        if param is not None and param.startswith("tools["):
            k = int(param[len("tools["):param.index("]")])
            param = paths[k] + param[param.index("]") + 1:].replace(".function.", ".")
        raise InvalidRequest(exc.message.replace(exc.param or "\0", param or ""), param) from None
