"""router/upstream/scrub.py and its edges: no configured key comes back out of an
upstream's text (issue 40, finding 6), whole, split across chunks, escaped by a JSON
encoder, in a header, or quoted by a transport error; a masked key is left alone."""

from __future__ import annotations

import base64
import html
import re
import urllib.parse

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.upstream.checks import check
from router.upstream.pool import Upstreams
from router.upstream.relay import Relay
from router.upstream.scrub import REDACTED, Scrubber, scrubbed_errors
from supervisor.config import Config, ServerConfig, SupervisorConfig
from supervisor.config.schema import UpstreamSpec
from supervisor.errors import WorkerUnavailable

KEY = "sk-proj-Ab/9<x>&y\"z\\0123456789"
OTHER = "sk-other-0123456789abcdef"
A = "http://a:8080/v1"


def test_every_form_of_every_key_is_taken_out_and_a_masked_one_left() -> None:
    s = Scrubber([KEY, OTHER])
    assert s.text(f"Incorrect API key provided: Bearer {KEY}.") == f"Incorrect API key provided: Bearer {REDACTED}."
    assert s.text(f"x-api-key was {OTHER}") == f"x-api-key was {REDACTED}"
    escaped = '"sk-proj-Ab\\/9<x>&y\\"z\\\\0123456789"'  # as PHP's json_encode writes it
    go = '"sk-proj-Ab/9\\u003cx\\u003e\\u0026y\\"z\\\\0123456789"'  # as Go's encoding/json does
    quoted = "key=sk-proj-Ab%2F9%3Cx%3E%26y%22z%5C0123456789"
    for text in (escaped, go, quoted):
        assert KEY[-10:] not in s.text(text), text
    assert s.data(f"a {KEY} b".encode()) == f"a {REDACTED} b".encode()
    assert s.text("Incorrect API key provided: sk-proj-***6789.") == "Incorrect API key provided: sk-proj-***6789."
    # A key that holds another is taken out whole.
    assert Scrubber(["abcdefgh", "abcdefgh-longer"]).text("abcdefgh-longer") == REDACTED
    assert not Scrubber([]) and Scrubber([]).text(KEY) == KEY


def test_a_key_split_across_chunks_never_passes_and_nothing_else_is_held() -> None:
    text = f'data: {{"error": {{"message": "Bearer {KEY} refused"}}}}\n\n'.encode()
    for cut in range(1, len(text)):
        stream = Scrubber([KEY]).stream()
        out = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.end()
        # Whole once joined, so no piece ever carried a part of the key that the next completed.
        assert out == text.replace(KEY.encode(), REDACTED.encode()), cut
    # An event's closing newline is in no key: a stream of events holds nothing back.
    stream = Scrubber([KEY]).stream()
    assert stream.feed(b'data: {"text": "s"}\n\n') == b'data: {"text": "s"}\n\n'
    # A chunk that ends like a key's start waits for the next; at the end it goes as it was.
    # (A word at a chunk's end waits too: it may be base64 that the next chunk goes on with.)
    assert stream.feed(b"token sk-pr") == b"token " and stream.feed(b"ose") == b""
    assert stream.feed(b" and\n") == b"sk-prose and\n"
    assert stream.feed(b"sk-proj") == b"" and stream.end() == b"sk-proj"


def test_a_transport_errors_text_loses_the_key_and_keeps_its_class() -> None:
    with pytest.raises(httpx.RemoteProtocolError) as caught, scrubbed_errors(Scrubber([KEY])):
        raise httpx.RemoteProtocolError(f"illegal header line: b'x-echo: Bearer {KEY}'")
    assert str(caught.value) == f"illegal header line: b'x-echo: Bearer {REDACTED}'"
    assert caught.value.__suppress_context__


def _pool(*specs: UpstreamSpec, fleet_key: str | None = None) -> tuple[Upstreams, list[Config]]:
    configs = [Config(ServerConfig(), SupervisorConfig(), {}, upstreams={s.name: s for s in specs}, fleet_key=fleet_key)]
    return Upstreams(lambda: configs[-1], lambda name: None), configs


def test_every_key_sent_anywhere_is_scrubbed_from_every_upstream_even_after_a_reload() -> None:
    one = UpstreamSpec(name="one", urls=(A,), model="one", api_key=KEY)
    two = UpstreamSpec(name="two", urls=(A,), model="two", api_key=OTHER)
    pool, configs = _pool(one, two, fleet_key="fleet-admin-key-0123")
    assert pool.scrubber().text(f"{KEY} {OTHER} fleet-admin-key-0123") == f"{REDACTED} {REDACTED} {REDACTED}"
    # A reload that rotates a key: an answer to a request sent with the old one is still scrubbed.
    configs.append(Config(ServerConfig(), SupervisorConfig(), {}, upstreams={"one": UpstreamSpec(
        name="one", urls=(A,), model="one", api_key="sk-rotated-0123456789")}))
    assert pool.scrubber().text(f"{KEY} sk-rotated-0123456789") == f"{REDACTED} {REDACTED}"


@pytest.mark.trio
async def test_an_upstream_that_quotes_its_key_in_a_header_a_body_or_an_error_is_scrubbed() -> None:
    spec = UpstreamSpec(name="m", urls=(A,), model="m", api_key=KEY)
    pool, _ = _pool(spec)

    def quoting(request: httpx.Request) -> httpx.Response:
        sent = request.headers["authorization"]
        body = httpx.ByteStream(f'{{"error": {{"message": "Incorrect API key provided: {sent}"}}}}'.encode())
        return httpx.Response(401, headers={"content-type": "application/json", "request-id": sent}, stream=body)

    relay = Relay(pool, httpx.AsyncClient(transport=httpx.MockTransport(quoting)), "1.1 corral-test")
    relayed = await relay.send(spec, "k", "/v1/chat/completions", "", {}, b"{}")
    assert relayed is not None and relayed.headers["request-id"] == f"Bearer {REDACTED}"
    body = b"".join([chunk async for chunk in relayed.body])
    assert body == f'{{"error": {{"message": "Incorrect API key provided: Bearer {REDACTED}"}}}}'.encode()

    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError(f"illegal header line: b'www-authenticate: Bearer {KEY}'", request=request)

    relay = Relay(pool, httpx.AsyncClient(transport=httpx.MockTransport(broken)), "1.1 corral-test")
    with pytest.raises(WorkerUnavailable):  # no replica answered
        await relay.send(spec, "k", "/v1/chat/completions", "", {}, b"{}")
    assert pool.of("m", A).health.last_error == f"illegal header line: b'www-authenticate: Bearer {REDACTED}'"
    await check(pool, httpx.AsyncClient(transport=httpx.MockTransport(broken)), spec, A, 1.0)
    assert KEY not in (pool.of("m", A).health.last_error or "") and REDACTED in (pool.of("m", A).health.last_error or "")


def _escaped(key: str, which: list[int]) -> str:
    """`key` as a JSON encoder may write it: characters `which` as \\uXXXX (some write
    every one so; .NET writes `+` and `&` so), `/` sometimes as \\/, quotes and
    backslashes escaped."""
    out = []
    for i, ch in enumerate(key):
        if i in which:
            out.append(f"\\u{ord(ch):04x}" if i % 2 else f"\\u{ord(ch):04X}")
        elif ch in '"\\':
            out.append("\\" + ch)
        elif ch == "/" and i % 3 == 0:
            out.append("\\/")
        else:
            out.append(ch)
    return "".join(out)


def _unescaped(data: bytes) -> str:
    """What a client's JSON parser reads out of `data`'s strings."""
    return re.sub(r'\\(u[0-9a-fA-F]{4}|["\\/])', lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "u" else m.group(1), data.decode())


def test_a_key_written_with_json_escapes_is_taken_out_whole() -> None:
    # The outside probe of issue 40: "Bearer \\u0073\\u006b\\u002d..." passed, and the client's
    # JSON parser read the key; a translated route wrote it plain into its own answer.
    s = Scrubber([KEY, "Up/Str+eam=SECRET-0123&<x>"])
    every = _escaped(KEY, list(range(len(KEY))))
    dotnet = "Up/Str\\u002Beam=SECRET-0123\\u0026\\u003cx\\u003e"
    for body in (f'{{"error": "you sent Bearer {every}"}}', f'{{"e": "{dotnet}"}}'):
        out = s.data(body.encode())
        assert REDACTED.encode() in out and KEY not in _unescaped(out) and "SECRET-0123" not in _unescaped(out), out


def test_a_long_run_of_a_keys_start_is_taken_out_and_a_masked_key_is_not() -> None:
    s = Scrubber([KEY])
    for cut in (1, 4, 8):  # the key less its last characters: a guess or a few from it
        assert s.text(f"Bearer {KEY[:-cut]}!") == f"Bearer {REDACTED}!"
    assert s.text(f"Bearer {KEY[:8]}") == f"Bearer {KEY[:8]}"  # "sk-proj-": no secret
    assert s.text(f"Bearer {KEY[:9]}") == f"Bearer {REDACTED}"  # one more is
    assert s.text("key sk-proj-********6789") == "key sk-proj-********6789"


def _streamed(data: st.DataObject, body: bytes) -> bytes:
    """`body` through a stream's scrub, cut where hypothesis draws (up to six cuts)."""
    cuts = sorted(data.draw(st.lists(st.integers(1, len(body) - 1), unique=True, max_size=6)))
    stream = Scrubber([KEY, OTHER]).stream()
    return b"".join(stream.feed(body[a:b]) for a, b in zip([0, *cuts], [*cuts, len(body)])) + stream.end()


@settings(max_examples=300)
@given(st.data())
def test_no_mix_of_escapes_and_chunk_cuts_lets_the_key_through(data: st.DataObject) -> None:
    which = data.draw(st.lists(st.integers(0, len(KEY) - 1), unique=True))
    body = f'data: {{"message": "Bearer {_escaped(KEY, which)} refused"}}\n\n'.encode()
    read = _unescaped(_streamed(data, body))
    assert KEY not in read and KEY[:22] not in read and REDACTED in read and read.endswith(' refused"}\n\n')


def _html(key: str, which: list[int]) -> str:
    """`key` as an HTML page may write it: characters `which` as numeric references
    (decimal or hex), and `&<>"` as named ones."""
    named = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}
    out = []
    for i, ch in enumerate(key):
        if i in which:
            out.append(f"&#{ord(ch)};" if i % 2 else f"&#x{ord(ch):x};")
        else:
            out.append(named.get(ch, ch))
    return "".join(out)


def _html_unescaped(data: bytes) -> str:
    """What a browser shows of `data`."""
    return html.unescape(data.decode())


def test_a_key_written_as_html_base64_or_masked_too_little_is_taken_out() -> None:
    """The outside probe of issue 40 (N2): an error page with the key as numeric character
    references, one with its `&<>` as entities, a key in base64, and a "mask" that showed
    17 of its 27 characters all passed."""
    s = Scrubber([KEY, "Up/Str+eam=SECRET-42&<x>"])
    for body in (
        f"<html>bad key {_html(KEY, list(range(len(KEY))))}</html>",
        f"<p>bad key {_html(KEY, [])}</p>",
        "<p>bad key Up/Str+eam=SECRET-42&amp;&lt;x&gt;</p>",
    ):
        out = s.data(body.encode())
        assert REDACTED.encode() in out and KEY not in _html_unescaped(out) and "SECRET-42" not in _html_unescaped(out), out
    for offset in range(3):  # the key at each of base64's three alignments
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"u:"[:offset] + KEY.encode()).decode()
            out = s.text(f"auth was {encoded}")
            assert REDACTED in out and encoded[4:-4] not in out, (offset, out)
    for shown in ("sk-proj-Ab/9<x>&****6789", "sk-proj-Ab/9<x****3456789", "sk-proj-Ab/9<x>&y..."):
        assert REDACTED in s.text(f"Incorrect API key provided: {shown}"), shown
    # OpenAI's own mask is left alone: it tells the operator which key was refused.
    for mask in ("sk-proj-***6789", "sk-proj-********6789", "sk-p…6789", "sk-proj-...6789"):
        assert s.text(f"key {mask}") == f"key {mask}", mask


@settings(max_examples=200)
@given(st.data())
def test_no_mix_of_html_references_and_chunk_cuts_lets_the_key_through(data: st.DataObject) -> None:
    which = data.draw(st.lists(st.integers(0, len(KEY) - 1), unique=True))
    body = f"<html><p>Bearer {_html(KEY, which)} refused</p></html>\n".encode()
    read = _html_unescaped(_streamed(data, body))
    assert KEY not in read and KEY[:22] not in read and REDACTED in read and read.endswith(" refused</p></html>\n")


SECRET2 = "Up/Str+eam=SECRET-42&<x>"


def _forms(key: str) -> dict[str, str]:
    """The outside probe's second round (issue 40, N2): forms that passed the first fix."""
    return {
        "html, no semicolons": "".join(f"&#{ord(c)}" for c in key),
        "html, zero padded": "".join(f"&#00000000{ord(c)};" if i % 2 else f"&#x0000{ord(c):x};" for i, c in enumerate(key)),
        "html5 names": html.escape(key).replace("/", "&sol;").replace("+", "&plus;").replace("=", "&equals;"),
        "go json of html": "".join(f"\\u0026#{ord(c)};" for c in key),
        "percent, lower case": "".join(f"%{ord(c):02x}" if not c.isalnum() else c for c in key),
        "percent, every character": "".join(f"%{ord(c):02X}" for c in key),
        # The third probe's: layers split across chunks, and base64 of a part or of a form.
        "url of html": urllib.parse.quote("".join(f"&#{ord(c)};" for c in key), safe=""),
        "html of url": "".join(f"&#{ord(c)};" for c in urllib.parse.quote(key, safe="")),
        "json of url of url": "".join(f"\\u{ord(c):04x}" for c in urllib.parse.quote(urllib.parse.quote(key, safe=""), safe="")),
    }


def _no_run_of(read: str, key: str) -> None:
    """No reader of `read` sees more of `key` than a mask shows: 8 of its start, 4 of its
    end, 11 anywhere."""
    assert key[:9] not in read and key[-5:] not in read, read
    assert not any(key[j : j + 12] in read for j in range(len(key) - 11)), read


def _as_read(text: str) -> str:
    """Every escape of the forms above decoded, as many times as it was applied."""
    for _ in range(3):
        text = html.unescape(urllib.parse.unquote(_unescaped(text.encode()) if "\\" in text else text))
    return text


@pytest.mark.parametrize("key", [KEY, SECRET2], ids=["key", "secret2"])
def test_every_escape_a_reader_decodes_in_any_layering_is_seen_through(key: str) -> None:
    s = Scrubber([KEY, SECRET2])
    for name, form in _forms(key).items():
        assert _as_read(form) == key, name  # the form is one a reader reads as the key
        _no_run_of(_as_read(s.text(f"bad key {form} (end)")), key)


def test_a_run_of_a_key_shows_no_more_than_a_mask_does() -> None:
    s = Scrubber([KEY])
    for shown in (KEY[:10] + "XXXX" + KEY[-4:], KEY[:10] + "####", KEY[:4] + "[...]" + KEY[-6:], KEY[5:19], KEY[-9:]):
        _no_run_of(s.text(f"Incorrect API key provided: {shown}."), KEY)
    for mask in ("sk-proj-***6789", "sk-proj-XXXX6789", "sk-proj-[...]6789"):
        assert s.text(f"key {mask}") == f"key {mask}", mask


@settings(max_examples=300)
@given(st.data())
def test_no_form_in_any_chunking_lets_a_run_of_the_key_through(data: st.DataObject) -> None:
    """Any of the forms, or base64, or a part of the key, cut into chunks of any sizes down
    to one byte (the probe's base64 in chunks of two passed, and so could the halves of a
    run): joined, no reader sees more than a mask shows."""
    forms = [
        *_forms(KEY).values(), KEY[3:20], KEY, base64.b64encode(KEY.encode()).decode(),
        base64.b64encode(KEY[:12].encode()).decode(), base64.urlsafe_b64encode(b"u:" + KEY.encode()).decode(),
        base64.b64encode(urllib.parse.quote(KEY, safe="").encode()).decode(),
    ]
    form = data.draw(st.sampled_from(forms))
    body = f"Incorrect key: {form} (end)\n".encode()
    step = data.draw(st.integers(0, 7))  # 0: random cuts; else every `step` bytes
    if step:
        cuts = list(range(step, len(body), step))
    else:
        cuts = sorted(data.draw(st.lists(st.integers(1, len(body) - 1), unique=True, max_size=40)))
    stream = Scrubber([KEY, OTHER]).stream()
    out = b"".join(stream.feed(body[a:b]) for a, b in zip([0, *cuts], [*cuts, len(body)])) + stream.end()
    read = _as_read(out.decode())
    _no_run_of(read, KEY)
    for run in re.findall(r"[A-Za-z0-9+/_-]{8,}", out.decode()):  # what base64 in it says
        _no_run_of(_as_read(base64.b64decode(run.replace("-", "+").replace("_", "/")[: len(run) // 4 * 4]).decode("latin-1")), KEY)
    assert read.endswith("(end)\n")
