"""Three Corral processes on loopback (issue 25's acceptance): a front whose models are
upstreams of two backs. Every dialect reaches them through the front, as the official
clients send it; streams arrive as the backs send them; killing one back under load loses
no request that had not started its answer, and the front's /v1/models shows that replica
out of rotation within the health interval, and back once it returns.

The backs are real `corral serve`s with the demo model (a chat model and an embedding
model), so what the front relays is what a back really answers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ROOT, Server, start_server, stop_server, die_with_the_tests
from tests.e2e.test_balancers import BACKEND
from tests.e2e.test_kv_mixes import CANARY_TEXT

# The balancers' back (the demo model as `demo`), with an embedding model beside it.
BACK = BACKEND + """
[models.embed]
path = "{MODEL}"
embeddings = true
slots = 1
n_ctx = 512
"""

HEALTH_INTERVAL = 0.5

FRONT = """
[server]
port = {PORT}

[supervisor]
health_interval = %s

[models.chat]
upstream = [%%s]
upstream_model = "demo"
upstream_dialects = ["openai", "anthropic", "responses", "ollama", "llama"]
aliases = ["demo"]

[models.embed]
upstream = [%%s]

# The first back's chat model again, as an upstream that speaks OpenAI's dialect only
# (the default): Anthropic's, Responses' and Ollama's requests reach it translated.
[models.plain]
upstream = %%s
upstream_model = "demo"

# And as an upstream that speaks Anthropic's Messages API only (api.anthropic.com's
# place): OpenAI's, Responses' and Ollama's chats reach it translated.
[models.claude]
upstream = %%s
upstream_model = "demo"
upstream_dialects = ["anthropic"]
""" % HEALTH_INTERVAL


class Fleet:
    def __init__(self, front: Server, backs: list[Server], back_dirs: list[Path]) -> None:
        self.front, self.backs, self.back_dirs = front, backs, back_dirs

    def replicas(self) -> list[dict[str, object]]:
        models = httpx.get(self.front.base + "/models", timeout=10).json()["data"]
        entry = next(m for m in models if m["id"] == "chat")
        replicas: list[dict[str, object]] = entry["upstream"]["replicas"]
        return replicas


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    dirs = [tmp_path_factory.mktemp(f"back{i}") for i in range(2)]
    backs = [start_server(d, BACK) for d in dirs]
    urls = ", ".join(f'"{b.base}"' for b in backs)
    front = start_server(tmp_path_factory.mktemp("front"), FRONT % (urls, urls, f'"{backs[0].base}"', f'"{backs[0].base}"'))
    try:
        yield Fleet(front, backs, dirs)
    finally:
        stop_server(front)
        for back in backs:
            if back.process.poll() is None:
                stop_server(back)


def completion(url: str, model: str) -> str:
    r = httpx.post(
        url + "/v1/completions", timeout=120,
        json={"model": model, "prompt": CANARY_TEXT, "max_tokens": 12, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["text"]
    return text


def test_every_dialect_reaches_the_backs_through_the_front(fleet: Fleet) -> None:
    front = fleet.front.url
    # The front's answer is the back's, greedy token for token (the canary's every token
    # wins by 2 or more in log-probability, so batch shape cannot flip one).
    assert completion(front, "chat") == completion(fleet.backs[0].url, "demo") != ""
    oa = openai.OpenAI(base_url=fleet.front.base, api_key="none", max_retries=0)
    chat = oa.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Say hi."}], max_tokens=5)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens <= 5
    assert chat.model == "demo"  # the back's answer, as it named the model
    streamed = list(oa.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Say hi."}], max_tokens=5, stream=True
    ))
    assert streamed[-1].choices[0].finish_reason in ("length", "stop")
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    vectors = oa.embeddings.create(model="embed", input=["one", "two"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) > 100
    responses = oa.responses.create(model="chat", input="Say hi.", max_output_tokens=16)
    assert responses.output_text
    message = anthropic.Anthropic(base_url=front, api_key="none", max_retries=0).messages.create(
        model="chat", max_tokens=5, messages=[{"role": "user", "content": "Say hi."}]
    )
    assert message.content[0].type == "text" and message.stop_reason in ("max_tokens", "end_turn")
    answer = ollama.Client(host=front).chat(
        model="chat", messages=[{"role": "user", "content": "Say hi."}], options={"num_predict": 5}
    )
    assert answer.message.content and answer.done
    native = httpx.post(front + "/completion", json={"model": "chat", "prompt": CANARY_TEXT, "n_predict": 4}, timeout=60)
    assert native.status_code == 200 and native.json()["tokens_predicted"] == 4
    # `embed` speaks OpenAI's dialect only (the default): a route with no translation to
    # it is refused, naming model.
    refused = httpx.post(front + "/tokenize", json={"model": "embed", "content": "x"}, timeout=10)
    assert refused.status_code == 400 and "speaks openai" in refused.json()["error"]["message"]


def test_other_dialects_reach_an_openai_only_upstream_translated(fleet: Fleet) -> None:
    """`plain` is the backs' model behind an upstream that speaks only OpenAI's API: each
    dialect's official client gets, through the front's translation, the answer the back
    gives that dialect natively (greedy, so token for token)."""
    front, back = fleet.front.url, fleet.backs[0].url
    turn = [{"role": "user", "content": "Name three colours."}]

    def claude(url: str, model: str) -> anthropic.types.Message:
        return anthropic.Anthropic(base_url=url, api_key="none", max_retries=0).messages.create(
            model=model, max_tokens=8, system="Answer briefly.", messages=turn,  # type: ignore[arg-type]
            extra_body={"temperature": 0},  # the SDK (2.x) no longer has the argument; the API has the field
        )

    def olla(host: str, model: str) -> str:
        parts = ollama.Client(host=host).chat(
            model=model, messages=[{"role": "system", "content": "Answer briefly."}, *turn], stream=True,
            options={"temperature": 0, "num_predict": 8},
        )
        return "".join(p.message.content or "" for p in parts)

    def responses(base: str, model: str) -> str:
        oa = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        return oa.responses.create(
            model=model, instructions="Answer briefly.", input="Name three colours.", max_output_tokens=8, temperature=0,
        ).output_text

    # Greedy is token for token between two runs only where no step is a near tie: the
    # float sums of a decode follow the batch and the cells' places in the cache. With
    # this system prompt every one of the 8 tokens wins by 2.0 or more in log-probability
    # (measured); without it, the fifth wins by 0.02, and a cached prompt and a fresh one
    # part there.
    via_front, native = claude(front, "plain"), claude(back, "demo")
    assert via_front.content[0].type == native.content[0].type == "text"
    assert via_front.content[0].text == native.content[0].text != ""
    assert via_front.stop_reason == native.stop_reason and via_front.usage.output_tokens == native.usage.output_tokens
    with anthropic.Anthropic(base_url=front, api_key="none", max_retries=0).messages.stream(
        model="plain", max_tokens=8, system="Answer briefly.", messages=turn,  # type: ignore[arg-type]
        extra_body={"temperature": 0},
    ) as stream:
        assert "".join(stream.text_stream) == native.content[0].text

    assert olla(front, "plain") == olla(back, "demo") != ""
    # llama-server's /completion: a text completion there, answered in llama-server's shape.
    far_text = httpx.post(front + "/completion", timeout=60, json={
        "model": "plain", "prompt": CANARY_TEXT, "n_predict": 12, "temperature": 0})
    near_text = httpx.post(back + "/completion", timeout=60, json={
        "model": "demo", "prompt": CANARY_TEXT, "n_predict": 12, "temperature": 0})
    assert far_text.json()["content"] == near_text.json()["content"] != ""
    assert far_text.json()["tokens_predicted"] == near_text.json()["tokens_predicted"] == 12
    assert responses(fleet.front.base, "plain") == responses(fleet.backs[0].base, "demo") != ""
    # `embed` speaks OpenAI's dialect only: Ollama's embeddings reach it as /v1/embeddings.
    far = ollama.Client(host=front).embed(model="embed", input=["one", "two"])
    near = ollama.Client(host=back).embed(model="embed", input=["one", "two"])
    assert len(far.embeddings) == 2 and far.embeddings[1] == pytest.approx(near.embeddings[1], abs=1e-5)
    # The conversation is the front's to keep: a second turn names the first by its id.
    oa = openai.OpenAI(base_url=fleet.front.base, api_key="none", max_retries=0)
    first = oa.responses.create(model="plain", input="Name three colours.", max_output_tokens=8)
    again = oa.responses.create(model="plain", input="And one more?", previous_response_id=first.id, max_output_tokens=8)
    assert again.output_text and again.usage is not None and again.usage.input_tokens > first.usage.input_tokens  # type: ignore[union-attr]


def test_openai_and_ollama_clients_reach_an_anthropic_only_upstream_translated(fleet: Fleet) -> None:
    """`claude` is the first back's model behind an upstream that speaks only Anthropic's
    Messages API: the openai client (chat, streamed chat, Responses) and the ollama client
    get, through the front's translation to /v1/messages, the answer the back gives their
    dialect natively (greedy, the near-tie-free prompt of the test above)."""
    system, turn = {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name three colours."}

    def chat(base: str, model: str) -> openai.types.chat.ChatCompletion:
        oa = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        return oa.chat.completions.create(model=model, messages=[system, turn], max_tokens=8, temperature=0)  # type: ignore[list-item]

    via_front, native = chat(fleet.front.base, "claude"), chat(fleet.backs[0].base, "demo")
    assert via_front.choices[0].message.content == native.choices[0].message.content != ""
    assert via_front.choices[0].finish_reason == native.choices[0].finish_reason
    assert via_front.usage is not None and native.usage is not None
    assert (via_front.usage.prompt_tokens, via_front.usage.completion_tokens) == (
        native.usage.prompt_tokens, native.usage.completion_tokens)
    oa = openai.OpenAI(base_url=fleet.front.base, api_key="none", max_retries=0)
    streamed = oa.chat.completions.create(
        model="claude", messages=[system, turn], max_tokens=8, temperature=0, stream=True,  # type: ignore[list-item]
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == native.choices[0].message.content

    def olla(host: str, model: str) -> str:
        answer = ollama.Client(host=host).chat(model=model, messages=[system, turn], options={"temperature": 0, "num_predict": 8})
        return answer.message.content or ""

    assert olla(fleet.front.url, "claude") == olla(fleet.backs[0].url, "demo") != ""
    responses = oa.responses.create(
        model="claude", instructions="Answer briefly.", input="Name three colours.", max_output_tokens=8, temperature=0,
    )
    assert responses.output_text == native.choices[0].message.content
    # A forced call: the back's tool_use block comes back as OpenAI's tool call.
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    called = oa.chat.completions.create(
        model="claude", messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=40,
        tools=[weather], tool_choice={"type": "function", "function": {"name": "get_weather"}},  # type: ignore[list-item]
    )
    (call,) = called.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)  # type: ignore[union-attr]
    assert called.choices[0].finish_reason == "tool_calls"
    # The count routes ask the upstream's count_tokens, which counts as the back renders.
    counts = [
        httpx.post(base + "/chat/completions/input_tokens", json={"model": model, "messages": [system, turn]}, timeout=60)
        for base, model in ((fleet.front.base, "claude"), (fleet.backs[0].base, "demo"))
    ]
    assert counts[0].json()["input_tokens"] == counts[1].json()["input_tokens"] == native.usage.prompt_tokens


def test_a_stream_arrives_as_the_back_sends_it(fleet: Fleet) -> None:
    body = {"model": "chat", "prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True, "stream": True}
    times: list[float] = []
    with httpx.stream("POST", fleet.front.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        t0 = time.monotonic()
        for chunk in r.iter_raw():
            times += [time.monotonic() - t0] * chunk.count(b"data:")
    # Buffered, every event would arrive at the end; relayed, most arrive well before it.
    assert len(times) >= 48, times
    assert sum(t < times[-1] - 0.1 for t in times) >= len(times) // 2, times
    assert len({round(t, 2) for t in times}) >= 4, times


def test_a_conversation_stays_on_one_back(fleet: Fleet) -> None:
    def served(back: Server) -> float:
        text = httpx.get(back.url + "/metrics", timeout=10).text
        return sum(
            s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "corral_requests_total" and s.labels.get("endpoint") == "/v1/chat/completions"
        )

    before = [served(b) for b in fleet.backs]
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    for turn in range(4):  # each turn resends the conversation's start, as chat clients do
        r = httpx.post(fleet.front.base + "/chat/completions", timeout=120,
                       json={"model": "chat", "messages": messages, "max_tokens": 3})
        assert r.status_code == 200
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"And another ({turn})?"}]
    after = [served(b) for b in fleet.backs]
    assert sorted(a - b for a, b in zip(after, before)) == [0, 4]


async def ask(client: httpx.AsyncClient, base: str, model: str, user: str, tokens: int, into: list[int]) -> None:
    """One user's chat of exactly `tokens` tokens; its count goes `into` the list."""
    r = await client.post(base + "/chat/completions", json={
        "model": model, "user": user, "max_tokens": tokens, "ignore_eos": True,
        "messages": [{"role": "user", "content": f"Count, {user}."}],
    })
    assert r.status_code == 200, r.text
    into.append(r.json()["usage"]["completion_tokens"])


MIXED = """
[server]
port = {PORT}

[supervisor]
idle_timeout = 0

[models.both]
path = "{MODEL}"
slots = 1
n_ctx = 1024
chat_template = "gemma"
upstream = "%s"
upstream_model = "demo"
"""


def test_a_model_served_here_and_elsewhere_spills_over_when_its_slots_are_busy(
    fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`path` and `upstream` together: the local worker is one replica, and requests go to
    the remote one while its one slot is busy and requests wait, rather than queue."""
    back = fleet.backs[1]
    mixed = start_server(tmp_path_factory.mktemp("mixed"), MIXED % back.base)
    try:
        assert completion(mixed.url, "both")  # loads the local worker
        results: list[int] = []

        async def load() -> None:
            async with httpx.AsyncClient(timeout=120) as client, trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(ask, client, mixed.base, "both", f"spill-{i}", 32, results)
                    await trio.sleep(0.05)  # each sees the line as the last one left it

        trio.run(load)
        assert results == [32] * 4
        entry = next(m for m in httpx.get(mixed.base + "/models", timeout=10).json()["data"] if m["id"] == "both")
        relayed = entry["upstream"]["replicas"][0]["requests"].get("ok", 0)
        assert 1 <= relayed <= 3, entry  # some spilled over to the back, the others stayed here
    finally:
        stop_server(mixed)


def test_killing_a_back_under_load_loses_no_request_and_shows_it_down(fleet: Fleet) -> None:
    victim = fleet.backs[0]
    results: list[int] = []
    down_after: list[float] = []

    async def load() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(ask, client, fleet.front.base, "chat", f"user-{i}", 24, results)
                await trio.sleep(1.0)  # every request is being answered, none has finished
                victim.process.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                while True:  # the front's view, from the moment of the kill
                    replicas = (await client.get(fleet.front.base + "/models")).json()["data"][0]["upstream"]["replicas"]
                    if not next(r for r in replicas if r["url"] == victim.base)["healthy"]:
                        down_after.append(time.monotonic() - killed)
                        break
                    assert time.monotonic() - killed < 10, replicas
                    await trio.sleep(0.05)

    before = next(r for r in fleet.replicas() if r["url"] == victim.base)["requests"]
    ready = httpx.get(fleet.front.url + "/health", params={"model": "chat"}, timeout=10)
    assert ready.status_code == 200 and ready.json()["replicas_up"] == 2
    trio.run(load)
    assert results == [24] * 8  # every request answered in full
    # Some were on the victim when it died (bounded loads spread 8 over both backs): the
    # other back answered them.
    after = next(r for r in fleet.replicas() if r["url"] == victim.base)["requests"]
    assert isinstance(before, dict) and isinstance(after, dict)
    assert after.get("failed_over", 0) - before.get("failed_over", 0) >= 1, (before, after)
    # A balancer in front of the front still sees the model ready (one replica is up), and
    # `corral status` (/admin/models) names the replica that is down and why.
    ready = httpx.get(fleet.front.url + "/health", params={"model": "chat"}, timeout=10)
    assert ready.status_code == 200 and ready.json()["replicas_up"] == 1
    status = subprocess.run(
        [sys.executable, "-m", "corral", "status", "--url", fleet.front.url], cwd=ROOT, capture_output=True, text=True
    )
    assert status.returncode == 0, status.stderr
    words = " ".join(status.stdout.split())  # as wide as the terminal: no terminal here
    assert "upstream chat: 1 of 2 replicas up" in words and f"{victim.base} (down: all attempts to connect" in words
    assert down_after and down_after[0] <= HEALTH_INTERVAL + 0.5, down_after
    # The back returns on its port: checks bring it back into rotation (RISE = 2 good ones).
    fleet.backs[0] = back = restart(victim, fleet.back_dirs[0])
    deadline = time.monotonic() + 10
    while not next(r for r in fleet.replicas() if r["url"] == back.base)["healthy"]:
        assert time.monotonic() < deadline, fleet.replicas()
        time.sleep(0.1)


def restart(server: Server, folder: Path) -> Server:
    server.process.wait(timeout=10)
    time.sleep(0.5)  # its worker sees the socket close and exits
    log = folder / "server-again.log"
    proc = subprocess.Popen(
        [*server.process.args[:-2], "--config", str(folder / "config.toml")],  # type: ignore[index]
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, preexec_fn=die_with_the_tests,
    )
    again = Server(server.url, proc, log)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                return again
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        time.sleep(0.1)

