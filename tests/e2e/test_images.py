"""Images through every dialect, with the official clients, against examples/vision.toml as
shipped (the demo model with the random-weight projector of bench/projector.py: its answers
about an image mean nothing, so what is checked is what can be: the same image gives the
same greedy tokens, different images and no image give others, image tokens are counted,
a second turn reuses the image from the cache without encoding it again, and every bad
image is a 400 naming its part that leaves the worker serving).

Issue 42. The behaviours followed: OpenAI's image_url parts and Responses' input_image
(platform.openai.com/docs/guides/images-vision), Anthropic's base64 image blocks
(docs.anthropic.com/en/docs/build-with-claude/vision), Ollama's `images`
(github.com/ollama/ollama/blob/main/docs/api.md), llama-server's `multimodal_data` with its
media marker (tools/server/README.md, /completion).
"""

from __future__ import annotations

import base64
import io
import re
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import numpy as np
import ollama
import openai
import pytest
from PIL import Image

from bench import projector
from tests.e2e.conftest import DEMO_MODEL, ROOT, Server, pooled_briefly, start_server, stop_server

pytestmark = pytest.mark.usefixtures("sdk_warnings_are_errors")

IMAGE_TOKENS = projector.SIZES["tiny"].tokens  # 16


def vision_config(mmproj: Path) -> str:
    """examples/vision.toml as shipped, with this run's model, projector and port, and a
    text-only model beside it."""
    text = (ROOT / "examples" / "vision.toml").read_text()
    for pattern, new in (
        (r'(?m)^path = "\.\./models/gemma-3-270m-Q4_K_M\.gguf"$', 'path = "{MODEL}"'),
        (r'(?m)^mmproj = "\.\./models/mmproj-test\.gguf"', f'mmproj = "{mmproj}"'),
        # Image URLs are fetched from this host alone (the test's own image server).
        (r"(?m)^port = 8080\b", 'port = {PORT}\nimage_url_hosts = ["localhost"]'),
    ):
        text, n = re.subn(pattern, new, text)
        assert n == 1, f"examples/vision.toml no longer matches {pattern}"
    # Pings each second: the encode counter comes with each Pong.
    return text + (
        '\n[models.text-only]\npath = "{MODEL}"\nchat_template = "gemma"\nn_ctx = 1024\nslots = 1\n'
        "\n[supervisor]\nhealth_interval = 1\n"
    )


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("vision")
    projector.write(tmp / "mmproj-test.gguf")
    srv = start_server(tmp, vision_config(tmp / "mmproj-test.gguf"))
    yield srv
    assert stop_server(srv) == 0


def png(color: tuple[int, int, int] | None = None, seed: int = 0, size: int = 64, mode: str = "RGB", fmt: str = "PNG") -> bytes:
    if color is not None:
        arr = np.zeros((size, size, 3), np.uint8) + np.array(color, np.uint8)
    else:
        arr = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    im = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt)
    return buf.getvalue()


RED, BLUE = png((255, 0, 0)), png((0, 0, 255))


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def oa(vision: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=vision.base, api_key="x", max_retries=0, http_client=pooled_briefly()) as c:
        yield c


def ask(oa: openai.OpenAI, image: bytes | None, question: str = "What colour is this?", model: str = "vision") -> Any:
    content: list[Any] = [{"type": "text", "text": question}]
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": data_uri(image)}})
    return oa.chat.completions.create(
        model=model, temperature=0, max_tokens=8, messages=[{"role": "user", "content": content}]
    )


def metric(server: Server, name: str) -> float | None:
    text = httpx.get(server.url + "/metrics").text
    m = re.search(rf'^{name}{{model="gemma-vision"}} (\S+)$', text, re.M)
    return None if m is None else float(m.group(1))


def settled(server: Server, name: str, at_least: float = 0.0) -> float:
    """`name` once two Pongs in a row agree on it (and it is at least `at_least`)."""
    deadline = time.monotonic() + 20
    last = None
    while time.monotonic() < deadline:
        value = metric(server, name)
        if value is not None and value >= at_least and value == last:
            return value
        last = value
        time.sleep(1.2)
    raise AssertionError(f"{name} did not settle (last {last})")


def test_models_props_and_show_say_which_model_sees_images(vision: Server, oa: openai.OpenAI) -> None:
    models = {m.id: m.model_extra for m in oa.models.list().data}
    assert models["gemma-vision"]["modalities"] == {"vision": True, "audio": False}
    # llama-server's router mode (tools/server/server-models.cpp): what the pi coding agent reads.
    assert models["gemma-vision"]["architecture"] == {"input_modalities": ["text", "image"], "output_modalities": ["text"]}
    assert models["text-only"]["modalities"] == {"vision": False, "audio": False}
    ask(oa, None)  # loaded: /props speaks for the worker
    props = httpx.get(vision.url + "/props", params={"model": "gemma-vision"}).json()
    assert props["modalities"] == {"vision": True, "audio": False}
    admin = {m["name"]: m for m in httpx.get(vision.url + "/admin/models").json()["models"]}
    assert admin["gemma-vision"]["modalities"] == ["vision"] and admin["text-only"]["modalities"] == []  # the dashboard's
    show = ollama.Client(host=vision.url).show("gemma-vision")
    assert "vision" in (show.capabilities or [])
    assert "vision" not in (ollama.Client(host=vision.url).show("text-only").capabilities or [])


def test_openai_chat_image_url_answers_and_counts_the_image_tokens(oa: openai.OpenAI) -> None:
    with_image, without = ask(oa, RED), ask(oa, None)
    assert with_image.choices[0].message.content
    # The image's tokens, and the <start_of_image> <end_of_image> gemma-3 wraps it in.
    assert with_image.usage.prompt_tokens - without.usage.prompt_tokens >= IMAGE_TOKENS


def first_token(oa: openai.OpenAI, image: bytes | None) -> dict[str, float]:
    """The first token's top logprobs, greedy, for "What colour is this?" and `image`."""
    content: list[Any] = [{"type": "text", "text": "What colour is this?"}]
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": data_uri(image)}})
    r = oa.chat.completions.create(
        model="vision", temperature=0, max_tokens=1, logprobs=True, top_logprobs=8,
        messages=[{"role": "user", "content": content}],
    )
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content
    return {t.token: t.logprob for t in r.choices[0].logprobs.content[0].top_logprobs}


def alike(a: dict[str, float], b: dict[str, float], within: float) -> bool:
    """`a`'s three likeliest tokens are among `b`'s eight, each as likely to `within`."""
    return all(t in b and abs(a[t] - b[t]) <= within for t in sorted(a, key=a.__getitem__, reverse=True)[:3])


def test_the_same_image_repeats_and_other_images_or_none_differ(oa: openai.OpenAI) -> None:
    # Compared by distribution, not by greedy text: with random weights the first token is
    # a near tie, and llama.cpp's sums differ in the last bits with how the prompt was
    # split into batches and where its cells lie (a text prompt's do too), which can flip
    # a tie. A different image moves the distribution far more than that.
    red = first_token(oa, RED)
    assert alike(red, first_token(oa, RED), 0.1)
    for other in (first_token(oa, BLUE), first_token(oa, None), first_token(oa, png(seed=3))):
        assert not alike(red, other, 0.5) and not alike(other, red, 0.5), (red, other)


def test_a_second_turn_reuses_the_image_from_the_cache_without_encoding_it(vision: Server, oa: openai.OpenAI) -> None:
    image = png(seed=7)
    first = ask(oa, image, "Look at this.")
    encoded = settled(vision, "corral_model_images_encoded_total", 1)
    turn = [
        {"role": "user", "content": [{"type": "text", "text": "Look at this."}, {"type": "image_url", "image_url": {"url": data_uri(image)}}]},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And now?"},
    ]
    second = oa.chat.completions.create(model="vision", temperature=0, max_tokens=4, messages=turn)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1 > IMAGE_TOKENS, (cached, first.usage.prompt_tokens)
    assert settled(vision, "corral_model_images_encoded_total") == encoded


def test_an_image_in_another_request_is_not_taken_for_text_or_for_another_image(oa: openai.OpenAI) -> None:
    # Two images that differ in one pixel share no cached cells past the text before them.
    a = np.zeros((64, 64, 3), np.uint8)
    b = a.copy()
    b[5, 5] = (1, 0, 0)
    pa, pb = (io.BytesIO(), io.BytesIO())
    Image.fromarray(a).save(pa, "PNG")
    Image.fromarray(b).save(pb, "PNG")
    first = ask(oa, pa.getvalue(), "Which one?")
    second = ask(oa, pb.getvalue(), "Which one?")
    assert second.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - IMAGE_TOKENS


def test_responses_input_image(oa: openai.OpenAI) -> None:
    r = oa.responses.create(
        model="vision", temperature=0, max_output_tokens=8,
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What colour is this?"},
            {"type": "input_image", "image_url": data_uri(RED), "detail": "auto"},
        ]}],
    )
    assert r.output_text and r.usage is not None
    assert r.usage.input_tokens == ask(oa, RED).usage.prompt_tokens  # the same prompt, image and all


def test_anthropic_image_block(vision: Server, oa: openai.OpenAI) -> None:
    with anthropic.Anthropic(base_url=vision.url, api_key="x", max_retries=0) as c:
        msg = c.messages.create(
            model="vision", max_tokens=8,
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "What colour is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)}},
            ]}],
        )
        assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens >= 1
        usage = msg.usage
        # Anthropic counts the prompt's cached tokens apart; the blocks are joined by a
        # blank line, so the prompt is the chat's with one token more or so.
        total = usage.input_tokens + (usage.cache_read_input_tokens or 0)
        assert abs(total - ask(oa, RED).usage.prompt_tokens) <= 2 and total > IMAGE_TOKENS
        with pytest.raises(anthropic.BadRequestError) as info:
            c.messages.create(model="vision", max_tokens=8, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/latest/meta-data"}}]}])
        assert "messages[0].content[0].source.url" in str(info.value)


def test_ollama_images_in_chat_and_generate(vision: Server) -> None:
    c = ollama.Client(host=vision.url, timeout=120)
    chat = c.chat(model="vision", messages=[{"role": "user", "content": "What colour is this?", "images": [RED]}],
                  options={"temperature": 0, "num_predict": 8})
    assert chat.message.content
    assert (chat.prompt_eval_count or 0) > IMAGE_TOKENS
    gen = c.generate(model="vision", prompt="What colour is this?", images=[RED], options={"temperature": 0, "num_predict": 8})
    assert gen.response and gen.prompt_eval_count == chat.prompt_eval_count  # one user turn either way
    with pytest.raises(ollama.ResponseError) as info:
        c.chat(model="vision", messages=[{"role": "user", "content": "x", "images": [b"not an image at all"]}])
    assert info.value.status_code == 400 and "messages[0].images[0]" in str(info.value)


def test_llama_server_completion_multimodal_data(vision: Server) -> None:
    body = {
        "model": "vision", "n_predict": 8, "temperature": 0,
        "prompt": {"prompt_string": "<start_of_turn>user\nWhat colour is <__media__>?<end_of_turn>\n<start_of_turn>model\n",
                   "multimodal_data": [b64(RED)]},
    }
    r = httpx.post(vision.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["content"] and out["tokens_evaluated"] > IMAGE_TOKENS
    again = httpx.post(vision.url + "/completion", json=body, timeout=120).json()
    assert again["tokens_cached"] >= out["tokens_evaluated"] - 1  # the image too
    body["prompt"]["multimodal_data"] = [b64(RED), b64(BLUE)]  # type: ignore[index]
    bad = httpx.post(vision.url + "/completion", json=body, timeout=30)
    assert bad.status_code == 400 and "prompt.prompt_string" in bad.text


def test_a_users_text_that_says_the_media_marker_is_only_text(oa: openai.OpenAI) -> None:
    """llama-server's marker in a user's words is no place for an image: the image goes where
    its part stands, and the words stay words."""
    said = oa.chat.completions.create(model="vision", temperature=0, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is <__media__> here?"}, {"type": "image_url", "image_url": {"url": data_uri(RED)}}]}])
    plain = oa.chat.completions.create(model="vision", temperature=0, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is here?"}, {"type": "image_url", "image_url": {"url": data_uri(RED)}}]}])
    assert said.usage.prompt_tokens > plain.usage.prompt_tokens  # the words count as text


def test_a_text_only_model_answers_400_naming_the_part(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        ask(oa, RED, model="text-only")
    assert info.value.body["param"] == "messages[0].content[1].image_url.url"  # type: ignore[index]
    assert "does not take images" in info.value.body["message"]  # type: ignore[index]


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    """A local HTTP server with an image, a page and a redirect to cloud metadata."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/red.png":
                self.send_response(200)
                self.send_header("content-type", "image/png")
                self.send_header("content-length", str(len(RED)))
                self.end_headers()
                self.wfile.write(RED)
            elif self.path == "/moved":
                self.send_response(302)
                self.send_header("location", "http://169.254.169.254/latest/meta-data")
                self.end_headers()
            else:
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.end_headers()
                self.wfile.write(b"<html>")

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"{srv.server_address[1]}"
    srv.shutdown()


def test_image_urls_are_fetched_from_the_listed_hosts_only(oa: openai.OpenAI, image_host: str) -> None:
    def ask_url(url: str) -> Any:
        return oa.chat.completions.create(model="vision", temperature=0, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What colour is this?"}, {"type": "image_url", "image_url": {"url": url}}]}])

    fetched = ask_url(f"http://localhost:{image_host}/red.png")
    assert fetched.usage.prompt_tokens == ask(oa, RED).usage.prompt_tokens  # the same image, the same prompt
    for url, says in (
        (f"http://127.0.0.1:{image_host}/red.png", "not one"),  # the same server, by a name not listed
        ("http://169.254.169.254/latest/meta-data", "not one"),
        (f"http://localhost:{image_host}/moved", "redirects"),
        (f"http://localhost:{image_host}/page", "not an image"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            ask_url(url)
        assert info.value.body["param"] == "messages[0].content[1].image_url.url", info.value.body  # type: ignore[index]
        assert says in info.value.body["message"]  # type: ignore[index]


def _bomb() -> bytes:
    """A PNG whose header claims 100,000 x 100,000 pixels, with one row of data."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 301)) + chunk(b"IEND", b"")


def _animated() -> bytes:
    frames = [Image.new("RGB", (16, 16), c) for c in ("red", "blue")]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    return buf.getvalue()


def _sixteen_bit() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((16, 16), np.uint16) + 30000).save(buf, "PNG")
    return buf.getvalue()


BAD_IMAGES = {
    "truncated": (RED[: len(RED) // 2], "could not be decoded"),
    "bomb": (_bomb(), "pixels"),
    "animated": (_animated(), "animated"),
    "cmyk": (png((10, 20, 30), mode="CMYK", fmt="JPEG"), "CMYK"),
    "16-bit": (_sixteen_bit(), "16-bit"),
    "not an image": (b"%PDF-1.4\n" + b"x" * 100, "not an image"),
    "tiff": (png((1, 2, 3), fmt="TIFF"), "not an image"),
}


@pytest.mark.parametrize("kind", sorted(BAD_IMAGES))
def test_each_bad_image_is_a_400_naming_its_part_and_the_worker_serves_on(vision: Server, oa: openai.OpenAI, kind: str) -> None:
    data, says = BAD_IMAGES[kind]
    ask(oa, None)  # loaded
    before = vision.workers()["gemma-vision"]
    with pytest.raises(openai.BadRequestError) as info:
        ask(oa, data)
    body = info.value.body
    assert body["param"] == "messages[0].content[1].image_url.url", body  # type: ignore[index]
    assert says in body["message"], body  # type: ignore[index]
    assert ask(oa, RED).choices[0].message.content  # it serves on
    assert vision.workers()["gemma-vision"] == before  # the same worker: nothing crashed


SLOT_CONFIG = """
[server]
port = {PORT}
slot_save_path = "slots"

[models.v]
path = "{MODEL}"
mmproj = "MMPROJ"
chat_template = "gemma"
slots = 1
cached_prompts = 0
prompt_cache_bytes = 0
n_ctx = 1024
"""


def test_a_slot_file_keeps_its_image_as_that_images_tokens(tmp_path: Path) -> None:
    """llama-server's slot save and restore with an image in the slot: the restored slot
    serves the same image from its cells (the whole prompt cached), and only that image."""
    (tmp_path / "slots").mkdir()
    projector.write(tmp_path / "mmproj.gguf")
    srv = start_server(tmp_path, SLOT_CONFIG.replace("MMPROJ", str(tmp_path / "mmproj.gguf")))
    try:
        def complete(image: bytes) -> dict[str, Any]:
            body = {"model": "v", "n_predict": 2, "temperature": 0, "prompt": {
                "prompt_string": "<start_of_turn>user\nDescribe <__media__> in a word.<end_of_turn>\n<start_of_turn>model\n",
                "multimodal_data": [b64(image)]}}
            r = httpx.post(srv.url + "/completion", json=body, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        def act(action: str) -> httpx.Response:
            return httpx.post(f"{srv.url}/slots/0?action={action}&model=v", json={"filename": "img.bin"}, timeout=60)

        first = complete(RED)
        n_prompt = first["tokens_evaluated"]
        assert act("save").status_code == 200
        assert act("erase").status_code == 200
        assert act("restore").json()["n_restored"] == n_prompt + 1  # the prompt, and the token sampled last
        again = complete(RED)
        assert again["tokens_cached"] == n_prompt - 1, again  # image and all, from the file's cells
        assert act("restore").status_code == 200
        other = complete(BLUE)  # another image shares the text before it, never the image
        assert other["tokens_cached"] < n_prompt - IMAGE_TOKENS
    finally:
        assert stop_server(srv) == 0


def test_counted_input_tokens_include_the_image_as_the_prompt_takes_it(vision: Server, oa: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "What colour is this?"}, {"type": "image_url", "image_url": {"url": data_uri(RED)}}]}]
    counted = httpx.post(vision.base + "/chat/completions/input_tokens", json={"model": "vision", "messages": messages}, timeout=60)
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == ask(oa, RED).usage.prompt_tokens
    with anthropic.Anthropic(base_url=vision.url, api_key="x", max_retries=0) as c:
        n = c.messages.count_tokens(model="vision", messages=[{"role": "user", "content": [
            {"type": "text", "text": "What colour is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)}}]}])
        assert abs(n.input_tokens - counted.json()["input_tokens"]) <= 2 and n.input_tokens > IMAGE_TOKENS
