"""router/api/openai/schemas.py: request decoding and validation; every error names its parameter."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import pytest

from router.api.openai import fields as rf
from router.server.json_body import decode
from router.api.openai import schemas as s
from router.api.openai import translate
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import MAX_STOP_STRINGS, MEDIA_MARKER, ChatMessage, Media, SamplingParams


def body(**fields: Any) -> bytes:
    return msgspec.json.encode(fields)


def chat(**fields: Any) -> s.ChatRequest:
    fields.setdefault("model", "m")
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return decode(body(**fields), s.ChatRequest)


def completion(**fields: Any) -> s.CompletionRequest:
    fields.setdefault("model", "m")
    return decode(body(**fields), s.CompletionRequest)


def embedding(**fields: Any) -> s.EmbeddingRequest:
    fields.setdefault("model", "m")
    return decode(body(**fields), s.EmbeddingRequest)


# ---- decode -------------------------------------------------------------------------------------


def test_decode_valid_chat() -> None:
    r = chat(temperature=0.2, stop=["x"], max_completion_tokens=5)
    assert isinstance(r, s.ChatRequest)
    assert r.model == "m" and r.temperature == 0.2 and r.stop == ["x"]
    assert r.max_completion_tokens == 5


def test_decode_accepts_integer_for_float() -> None:
    assert chat(temperature=1).temperature == 1.0


@pytest.mark.parametrize(
    "raw", [b"{", b'{"model": "m",}', b"not json", b"\xff\xfe", b'{"model": "m"} trailing']
)
def test_decode_malformed_json(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(raw, s.ChatRequest)
    assert "could not parse the JSON body" in info.value.message
    assert info.value.param is None


@pytest.mark.parametrize("raw", [b"", b"   ", b"\n\t"])
def test_decode_empty_body(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(raw, s.ChatRequest)
    assert "empty" in info.value.message
    assert info.value.param is None


@pytest.mark.parametrize(
    ("kind", "raw"),
    [
        (s.ChatRequest, b'{"model": "m", "messages": [], "foo": 1}'),
        (s.CompletionRequest, b'{"model": "m", "prompt": "x", "foo": 1}'),
        (s.EmbeddingRequest, b'{"model": "m", "input": "x", "foo": 1}'),
    ],
)
def test_decode_unknown_field(kind: type[msgspec.Struct], raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(raw, kind)
    assert info.value.message == "Unrecognized request argument supplied: foo"
    assert info.value.param == "foo"


def test_decode_unknown_nested_field() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(
            body(model="m", stream=True, stream_options={"include_usage": True, "x": 1}),
            s.ChatRequest,
        )
    assert info.value.message == "Unrecognized request argument supplied: stream_options.x"
    assert info.value.param == "stream_options.x"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"model": 5}, "model"),
        ({"messages": {"role": "user"}}, "messages"),
        ({"stop": 5}, "stop"),
        ({"stop": ["a", 5]}, "stop[1]"),
        ({"n": "2"}, "n"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_decode_wrong_type_names_param(fields: dict[str, Any], param: str) -> None:
    fields = {"model": "m", **fields}
    with pytest.raises(InvalidRequest) as info:
        decode(body(**fields), s.ChatRequest)
    assert info.value.param == param
    assert f"'{param}'" in info.value.message


def test_a_missing_model_decodes_as_none_for_the_default_model() -> None:
    """`model` may be left out (or null): the supervisor then routes to [server]
    default_model, or answers 400 naming `model` (tests/sim/test_http.py)."""
    for extra in ({}, {"model": None}):
        r = decode(body(messages=[{"role": "user", "content": "x"}], **extra), s.ChatRequest)
        assert r.model is None
    assert decode(body(input="x"), s.EmbeddingRequest).model is None


@pytest.mark.parametrize("field", sorted(s.IGNORED))
def test_openai_fields_corral_does_not_act_on_are_accepted(field: str) -> None:
    values: dict[str, Any] = {
        "metadata": {"k": "v"}, "store": True, "prediction": {"type": "content", "content": "x"},
        "modalities": ["text"], "audio": {"voice": "alloy", "format": "mp3"},
        "web_search_options": {}, "service_tier": "auto",
    }
    raw = body(model="m", messages=[{"role": "user", "content": "x"}], **{field: values.get(field, "x")})
    decode(raw, s.ChatRequest)  # no InvalidRequest


def test_an_ignored_field_of_the_wrong_type_is_still_a_400() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(body(model="m", messages=[], store="yes"), s.ChatRequest)
    assert info.value.param == "store"


def test_decode_missing_embedding_input() -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(body(model="m"), s.EmbeddingRequest)
    assert info.value.param == "input"


def test_decode_non_object_body_is_invalid_request() -> None:
    for raw in [b"[]", b"null", b"3", b'"x"']:
        with pytest.raises(InvalidRequest):
            decode(raw, s.ChatRequest)


# ---- sampling_params ----------------------------------------------------------------------------


def test_sampling_params_defaults_are_llama_servers() -> None:
    """Pins 840e918: unset parameters sampled untruncated at temperature 1.0, which on the demo
    model's 262k vocabulary produced stray scripts."""
    r = chat()
    sp = rf.sampling_params(r, r.max_tokens)
    llama_server = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    assert sp == SamplingParams(max_tokens=None, stop=[], **llama_server)
    # One set of defaults: a frame built directly samples as an HTTP client's request does.
    assert sp == SamplingParams(max_tokens=None, stop=[])
    # Explicit values win, including the ones that turn truncation off (OpenAI's defaults).
    openai = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    sp = rf.sampling_params(chat(**openai), None)
    assert sp == SamplingParams(max_tokens=None, stop=[], **openai)


@pytest.mark.parametrize("kind", [s.ChatRequest, s.CompletionRequest])
def test_request_sampling_defaults_are_the_protocols(kind: type[s.SamplingFields]) -> None:
    """Issue 9, item 2 (20b2548): the router had 0.8/40/0.95/0.05 and SamplingParams
    1.0/0/1.0/0, so a frame built directly sampled differently from an HTTP request. A
    request that sets nothing now takes the model's defaults, the protocol's unless the
    config says otherwise (issue 22, item 1)."""
    assert rf.sampling_params(kind(), None) == SamplingParams()


def test_the_models_defaults_fill_what_the_request_leaves_unset() -> None:
    """llama-server's --temp, --top-k, --seed, ... as a model's config (issue 22, item 1):
    what the request sets wins, null included as unset (OpenAI's parameters are nullable)."""
    model = SamplingParams(temperature=0.1, top_k=3, top_p=0.5, min_p=0.2, seed=5, repeat_penalty=1.3,
                           repeat_last_n=16, presence_penalty=0.5, frequency_penalty=0.25, stop=["END"])
    assert rf.sampling_params(chat(), None, defaults=model) == model
    assert rf.sampling_params(chat(repeat_last_n=-1), None, defaults=model).repeat_last_n == -1
    assert rf.sampling_params(chat(temperature=None, seed=None, stop=None), None, defaults=model) == model
    mine = rf.sampling_params(chat(temperature=1.5, top_k=0, seed=9, stop=[], presence_penalty=0), None, defaults=model)
    assert (mine.temperature, mine.top_k, mine.seed, mine.stop, mine.presence_penalty) == (1.5, 0, 9, [], 0.0)
    assert (mine.top_p, mine.min_p, mine.repeat_penalty, mine.frequency_penalty) == (0.5, 0.2, 1.3, 0.25)
    job = translate.chat_job(chat(), "m", SamplingParams(max_tokens=7, temperature=0.0))
    assert (job.params.max_tokens, job.params.temperature) == (7, 0.0)
    assert translate.chat_job(chat(max_tokens=3), "m", SamplingParams(max_tokens=7)).params.max_tokens == 3


def test_sampling_params_maps_everything() -> None:
    r = chat(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.1,
        seed=7,
        repeat_penalty=1.2,
        repeat_last_n=-1,
        presence_penalty=1.0,
        frequency_penalty=-1.0,
        ignore_eos=True,
        stop="END",
    )
    sp = rf.sampling_params(r, 12)
    assert sp == SamplingParams(
        max_tokens=12,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.1,
        seed=7,
        repeat_penalty=1.2,
        repeat_last_n=-1,
        presence_penalty=1.0,
        frequency_penalty=-1.0,
        stop=["END"],
        ignore_eos=True,
    )


def test_stop_string_and_list() -> None:
    assert rf.sampling_params(chat(stop="x"), None).stop == ["x"]
    assert rf.sampling_params(chat(stop=["x", "y"]), None).stop == ["x", "y"]
    assert rf.sampling_params(chat(stop=None), None).stop == []
    assert rf.sampling_params(chat(stop=[]), None).stop == []


def test_logit_bias_in_every_form_llama_server_takes() -> None:
    """llama.cpp's test_completion.py test_logit_bias (ids and texts, OpenAI's object and
    llama-server's pairs) and server-schema.cpp's `false` to ban: ids parsed, texts left
    for the worker to tokenize, false a ban that is finite (no NaN if all are banned)."""
    from worker.protocol import LOGIT_BAN

    assert rf.logit_bias({"5": -100, "7": False}) == ({5: -100.0, 7: LOGIT_BAN}, {})
    assert rf.logit_bias([[5, 10], [" the", -100], ["x", False]]) == ({5: 10.0}, {" the": -100.0, "x": LOGIT_BAN})
    assert rf.logit_bias({" hello": 2.5}) == ({}, {" hello": 2.5})
    p = rf.sampling_params(chat(logit_bias=[[3, 1], ["a", -1]]), None)
    assert (p.logit_bias, p.logit_bias_text) == ({3: 1.0}, {"a": -1.0})
    assert LOGIT_BAN > float("-inf") and LOGIT_BAN < -1e6


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.01}, "top_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"min_p": 2}, "min_p"),
        ({"repeat_penalty": -1}, "repeat_penalty"),
        ({"top_k": -1}, "top_k"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"n": 129}, "n"),
        ({"n": 0}, "n"),
        ({"logit_bias": {"abc": True}}, "logit_bias"),  # only false bans; true means nothing
        ({"logit_bias": [[1, 2, 3]]}, "logit_bias"),
        ({"logit_bias": [5]}, "logit_bias"),
        ({"logit_bias": [[None, 1]]}, "logit_bias"),
        ({"logit_bias": {"": 1}}, "logit_bias"),
        ({"logit_bias": {"-5": 1.0}}, "logit_bias"),
        ({"logit_bias": {"5": 100.5}}, "logit_bias"),
        ({"logit_bias": {"5": -101}}, "logit_bias"),
        ({"logit_bias": {"99999999999": 1}}, "logit_bias"),
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": [str(i) for i in range(MAX_STOP_STRINGS + 1)]}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": False, "stream_options": {}}, "stream_options"),
    ],
)
def test_sampling_params_range_checks_name_param(fields: dict[str, Any], param: str) -> None:
    r = chat(**fields)
    with pytest.raises(InvalidRequest) as info:
        rf.sampling_params(r, r.max_tokens)
    assert info.value.param == param
    assert param in info.value.message.lower()


@pytest.mark.parametrize("value", [0, -1])
def test_max_tokens_below_one(value: int) -> None:
    r = chat(max_tokens=value)
    with pytest.raises(InvalidRequest) as info:
        rf.sampling_params(r, r.max_tokens)
    assert info.value.param == "max_tokens"
    assert "max_tokens" in info.value.message


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0},
        {"temperature": 2},
        {"top_p": 0},
        {"top_p": 1},
        {"presence_penalty": -2, "frequency_penalty": 2},
        {"stop": [str(i) for i in range(MAX_STOP_STRINGS)]},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"max_tokens": 1},
        {"n": 1},
        {"n": 128},
        {"logit_bias": {}},
        {"logit_bias": {"0": -100, "262143": 100}},
    ],
)
def test_sampling_params_boundaries_accepted(fields: dict[str, Any]) -> None:
    r = chat(**fields)
    rf.sampling_params(r, r.max_tokens)


def test_logit_bias_reaches_the_worker_with_int_ids() -> None:
    r = chat(logit_bias={"123": 5.0, "7": -100})
    assert rf.sampling_params(r, None).logit_bias == {123: 5.0, 7: -100.0}


def test_logit_bias_nan_is_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        rf.logit_bias({"1": float("nan")})
    assert info.value.param == "logit_bias"


@pytest.mark.parametrize(
    ("fields", "want"),
    [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 5}, 5),
     ({"logprobs": True, "top_logprobs": 20}, 20)],
)
def test_chat_logprobs(fields: dict[str, Any], want: int | None) -> None:
    assert rf.chat_logprobs(chat(**fields)) == want


@pytest.mark.parametrize(
    "fields", [{"top_logprobs": 3}, {"logprobs": False, "top_logprobs": 3}, {"logprobs": True, "top_logprobs": 21},
               {"logprobs": True, "top_logprobs": -1}],
)
def test_chat_top_logprobs_refused(fields: dict[str, Any]) -> None:
    """OpenAI refuses top_logprobs without logprobs: true."""
    with pytest.raises(InvalidRequest) as info:
        rf.chat_logprobs(chat(**fields))
    assert info.value.param == "top_logprobs"


@pytest.mark.parametrize(("value", "ok"), [(None, True), (0, True), (5, True), (20, True), (21, False), (-1, False)])
def test_completion_logprobs_range(value: int | None, ok: bool) -> None:
    r = completion(prompt="x", logprobs=value)
    if ok:
        assert rf.completion_logprobs(r) == value
    else:
        with pytest.raises(InvalidRequest) as info:
            rf.completion_logprobs(r)
        assert info.value.param == "logprobs"


# ---- chat_messages ------------------------------------------------------------------------------


def test_chat_messages_plain_strings() -> None:
    r = chat(
        messages=[
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        ]
    )
    assert rf.chat_messages(r) == [
        ChatMessage(role="system", content="Be kind."),
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="assistant", content="Hello"),
        ChatMessage(role="tool", content="42", tool_call_id="call_1"),
    ]


def test_chat_messages_text_parts_joined() -> None:
    r = chat(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}],
            }
        ]
    )
    assert rf.chat_messages(r) == [ChatMessage(role="user", content="Hello, world")]


def test_chat_messages_empty_parts_and_null_content() -> None:
    r = chat(
        messages=[
            {"role": "user", "content": []},
            {"role": "assistant", "content": None},
            {"role": "user"},
        ]
    )
    assert rf.chat_messages(r) == [
        ChatMessage(role="user", content=""),
        ChatMessage(role="assistant", content=""),
        ChatMessage(role="user", content=""),
    ]


def test_developer_maps_to_system() -> None:
    r = chat(messages=[{"role": "developer", "content": "rules"}, {"role": "user", "content": "q"}])
    assert rf.chat_messages(r)[0] == ChatMessage(role="system", content="rules")


def test_image_part_becomes_a_marker_and_its_bytes() -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 8
    r = chat(
        messages=[
            {"role": "system", "content": "s"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}},
                    {"type": "text", "text": " and this?"},
                    {"type": "image_url", "image_url": base64.b64encode(png + b"2").decode()},
                ],
            },
        ]
    )
    out = rf.chat_messages(r)
    assert out[0].media is None
    assert out[1].content == f"what is this?{MEDIA_MARKER} and this?{MEDIA_MARKER}"
    assert out[1].media == [
        Media(data=png, param="messages[1].content[1].image_url.url"),
        Media(data=png + b"2", param="messages[1].content[3].image_url"),
    ]


@pytest.mark.parametrize(
    ("url", "error", "says"),
    [
        ("file:///etc/passwd", InvalidRequest, "data URI"),
        ("data:image/png,rawbytes", InvalidRequest, "base64 data URI"),
        ("data:text/html;base64,PGgxPg==", InvalidRequest, "unsupported image type"),
        ("data:image/png;base64,!!notbase64!!", InvalidRequest, "not valid base64"),
        ("data:image/png;base64,", InvalidRequest, "empty"),
        (12, InvalidRequest, "expected a string"),
    ],
)
def test_image_urls_that_are_refused_name_the_part(url: object, error: type[Exception], says: str) -> None:
    r = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
    with pytest.raises(error) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[0].content[0].image_url.url"  # type: ignore[attr-defined]
    assert says in info.value.message  # type: ignore[attr-defined]


def test_an_http_image_url_is_kept_for_the_fetch_that_the_operator_allows_or_refuses() -> None:
    r = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://cdn.example/a.png"}}]}])
    (m,) = rf.chat_messages(r)
    assert m.media == [Media(data=b"", param="messages[0].content[0].image_url.url", url="https://cdn.example/a.png")]


WAV_HEAD = b"RIFF\x24\x00\x00\x00WAVEfmt "  # enough for the router, which never decodes
MP3_HEAD = b"ID3\x04\x00\x00\x00\x00\x00\x00"


def test_an_input_audio_part_becomes_audio_media_where_it_stands() -> None:
    data = base64.b64encode(WAV_HEAD).decode()
    r = chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Hear "}, {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
        {"type": "text", "text": " now"}]}])
    (m,) = rf.chat_messages(r)
    assert m.content == f"Hear {MEDIA_MARKER} now"
    assert m.media == [Media(data=WAV_HEAD, param="messages[0].content[1].input_audio.data", kind="audio")]


@pytest.mark.parametrize(
    ("value", "param", "says"),
    [
        ({"data": "", "format": "wav"}, "messages[0].content[0].input_audio.data", "the audio is empty"),
        ({"format": "wav"}, "messages[0].content[0].input_audio.data", "Missing required parameter"),
        ({"data": "AAAA"}, "messages[0].content[0].input_audio.format", "Missing required parameter"),
        ({"data": "AAAA", "format": "flac"}, "messages[0].content[0].input_audio.format", "expected one of ['wav', 'mp3']"),
        ({"data": "!!", "format": "wav"}, "messages[0].content[0].input_audio.data", "not valid base64 audio"),
        ({"data": 5, "format": "mp3"}, "messages[0].content[0].input_audio.data", "expected a base64 string"),
        ({"data": base64.b64encode(MP3_HEAD).decode(), "format": "wav"}, "messages[0].content[0].input_audio.format",
         "the data is MP3, not WAV"),
        ("a string", "messages[0].content[0].input_audio", "expected an object"),
    ],
)
def test_input_audio_that_is_refused_names_the_field(value: object, param: str, says: str) -> None:
    r = chat(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": value}]}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == param and says in info.value.message, info.value.message


def test_audio_is_taken_in_user_messages_only() -> None:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(WAV_HEAD).decode(), "format": "wav"}}
    r = chat(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": [part]}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[1].content[0].input_audio.data" and "audio is taken in user messages only" in info.value.message


def test_file_parts_are_refused_naming_position() -> None:
    r = chat(messages=[{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}])
    with pytest.raises(Unsupported) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[0].content[0]"


def test_non_dict_part_rejected() -> None:
    r = chat(messages=[{"role": "user", "content": ["just a string"]}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[0].content[0]"


def test_text_part_without_string_text() -> None:
    r = chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[0].content[0].text"


@pytest.mark.parametrize("role", ["robot", "", None, 3, "System", "function"])
def test_bad_role_rejected(role: Any) -> None:
    r = chat(messages=[{"role": "user", "content": "a"}, {"role": role, "content": "b"}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[1].role"


def test_missing_role_rejected() -> None:
    r = chat(messages=[{"content": "b"}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[0].role"


@pytest.mark.parametrize("content", [5, {"text": "x"}, True])
def test_bad_content_type_rejected(content: Any) -> None:
    r = chat(messages=[{"role": "user", "content": content}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[0].content"


def test_empty_messages_rejected() -> None:
    r = chat(messages=[])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages"


def test_missing_messages_rejected() -> None:
    r = decode(body(model="m"), s.ChatRequest)
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages"


def test_chat_accepted_no_op_features() -> None:
    r = chat(tools=[], logprobs=False, response_format={"type": "text"}, user="u", store=False)
    assert rf.chat_messages(r) == [ChatMessage(role="user", content="hi")]


# ---- completion_prompts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "want"),
    [
        ("Once upon", ["Once upon"]),
        (["Once upon"], ["Once upon"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [(1, 2, 3)]),
        ([[1, 2], [3]], [(1, 2), (3,)]),
        (["a", [3]], ["a", (3,)]),
        # llama-server's shapes (its test_completion.py / test_embedding.py mixed inputs;
        # server-common.cpp, tokenize_input_prompts): ids and strings mixed in one prompt,
        # objects, and lists that mix all of them.
        ([12, 34, "string", 56, 78], [(12, 34, "string", 56, 78)]),
        (["string1", [12, 34, 56]], ["string1", (12, 34, 56)]),
        ([[12, 34, 56], [12, "string", 34, 56]], [(12, 34, 56), (12, "string", 34, 56)]),
        ({"prompt_string": "string"}, ["string"]),
        ({"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}, ["hello world"]),
        (["s1", {"prompt_string": [1, "s2"]}, {"content": [{"type": "text", "text": "s3"}]}], ["s1", (1, "s2"), "s3"]),
    ],
)
def test_completion_prompt_shapes(prompt: Any, want: list[Any]) -> None:
    assert rf.completion_prompts(completion(prompt=prompt)) == want


def test_completion_prompt_default_empty() -> None:
    assert rf.completion_prompts(completion()) == [""]


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ([], "prompt"),
        ([[]], "prompt[0]"),
        ([-1, 2], "prompt"),
        ([True], "prompt[0]"),
        (["a", 1.5], "prompt[1]"),
        ([[1, 2.5]], "prompt[0]"),
        ([[2**31, "x"]], "prompt[0]"),
        ([[2**31]], "prompt[0]"),
        ([{"nope": 1}], "prompt[0]"),
        ({"prompt_string": 3}, "prompt"),
        ({"content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "prompt.content[0]"),
        (["x"] * 129, "prompt"),
    ],
)
def test_completion_prompt_bad_shapes_name_the_entry(prompt: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        rf.completion_prompts(completion(prompt=prompt))
    assert info.value.param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 2}, "best_of"),
    ],
)
def test_completion_unsupported_features(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(Unsupported) as info:
        rf.completion_prompts(completion(prompt="x", **fields))
    assert info.value.param == param


def test_completion_echo_with_logprobs_unsupported() -> None:
    with pytest.raises(Unsupported) as info:
        rf.completion_logprobs(completion(prompt="x", echo=True, logprobs=1))
    assert info.value.param == "echo"


def test_completion_accepted_no_op_features() -> None:
    assert rf.completion_prompts(completion(prompt="x", echo=True, suffix="", best_of=1, logprobs=0)) == ["x"]


# ---- embedding_inputs ---------------------------------------------------------------------------


def test_embedding_single_string() -> None:
    assert rf.embedding_inputs(embedding(input="hello")) == ["hello"]


def test_embedding_list_of_strings() -> None:
    assert rf.embedding_inputs(embedding(input=["a", "b"])) == ["a", "b"]


def test_embedding_empty_list() -> None:
    with pytest.raises(InvalidRequest) as info:
        rf.embedding_inputs(embedding(input=[]))
    assert info.value.param == "input"


@pytest.mark.parametrize("value", ["", ["a", ""]])
def test_embedding_empty_string(value: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        rf.embedding_inputs(embedding(input=value))
    assert info.value.param == "input"


@pytest.mark.parametrize(("value", "want"), [([1, 2, 3], [(1, 2, 3)]), ([[1, 2], [5]], [(1, 2), (5,)])])
def test_embedding_token_arrays(value: Any, want: list[Any]) -> None:
    assert rf.embedding_inputs(embedding(input=value)) == want


@pytest.mark.parametrize(
    ("value", "want"),
    [  # llama.cpp's test_embedding.py test_embedding_mixed_input
        (["a", [1]], ["a", (1,)]),
        (["a", 1], [("a", 1)]),  # holds an id: one mixed prompt
        ([[12, 34, 56], [12, "string", 34, 56]], [(12, 34, 56), (12, "string", 34, 56)]),
        ({"prompt_string": "string"}, ["string"]),
        (["s1", {"prompt_string": "s2"}, {"content": [{"type": "text", "text": "s3"}]}], ["s1", "s2", "s3"]),
    ],
)
def test_embedding_mixed_inputs(value: Any, want: list[Any]) -> None:
    assert rf.embedding_inputs(embedding(input=value)) == want


@pytest.mark.parametrize("value", [[[1], []], [[-1]], [{"x": 1}], [1.5]])
def test_embedding_bad_inputs(value: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        rf.embedding_inputs(embedding(input=value))
    assert info.value.param.startswith("input")


def test_embedding_dimensions_unsupported() -> None:
    with pytest.raises(Unsupported) as info:
        rf.embedding_inputs(embedding(input="x", dimensions=64))
    assert info.value.param == "dimensions"


def test_embedding_encoding_format() -> None:
    assert embedding(input="x", encoding_format="base64").encoding_format == "base64"
    with pytest.raises(InvalidRequest) as info:
        embedding(input="x", encoding_format="int8")
    assert info.value.param == "encoding_format"


def test_continue_final_message_and_add_generation_prompt() -> None:
    """llama.cpp's test_chat_completion.py: continue_final_message with
    add_generation_prompt true is a 400 (test_chat_template_continue_final_message_mutual_exclusion);
    with it false, the final assistant message is continued (..._vllm_compat)."""
    ask = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(InvalidRequest) as info:
        rf.generation_prompt(chat(messages=ask, add_generation_prompt=True, continue_final_message=True))
    assert info.value.param == "continue_final_message"
    assert rf.generation_prompt(chat(messages=ask, add_generation_prompt=False, continue_final_message=True)) is True
    with pytest.raises(InvalidRequest):
        rf.generation_prompt(chat(messages=ask[:1], continue_final_message=True))
    assert rf.generation_prompt(chat(messages=ask[:1], add_generation_prompt=False)) is False
    assert rf.generation_prompt(chat(messages=ask[:1])) is True


@pytest.mark.parametrize("role", ["system", "developer", "assistant", "tool"])
def test_images_are_taken_in_user_messages_only(role: str) -> None:
    extra = {"tool_call_id": "c1"} if role == "tool" else {}
    r = chat(messages=[{"role": role, "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}], **extra},
                       {"role": "user", "content": "q"}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[0].content[0].image_url.url" and "user messages only" in info.value.message


def test_an_image_detail_outside_openais_values_is_refused_and_data_uris_are_read_in_any_case() -> None:
    r = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk=", "detail": "ultra"}}]}])
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(r)
    assert info.value.param == "messages[0].content[0].image_url.detail"
    for url in ("DATA:image/png;BASE64,aGk=", "data:IMAGE/PNG;base64,aG\nk="):
        r = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}])
        assert rf.chat_messages(r)[0].media == [Media(data=b"hi", param="messages[0].content[0].image_url.url")]
    r = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aG\u00a0k="}}]}])
    with pytest.raises(InvalidRequest):  # only ASCII spaces and line breaks are dropped
        rf.chat_messages(r)
