"""Agent-like load: many users, each resending its whole conversation every turn after one
long system prompt that all of them share (issue 24).

  python -m bench.agents [--users 6] [--slots 4] [--turns 5] [--system-words 780]
                         [--reply 16] [--llama-server PATH]

Each user is a thread: turn after turn it sends the system prompt, its history and a new
question to /v1/chat/completions, streamed, greedy, `--reply` tokens at most, and waits for
the answer before its next turn; the users run at once, more of them than slots. Reported,
first turns and later turns apart: time to first token (median, p95; the first chunk that
carries text), prompt tokens sent and decoded (sent less those read from the cache), and
the wall time of the whole load.

Corral and llama-server (built from the same llama.cpp, `-kvu`, its default caching) run
one after the other in the same invocation, each with the same model, slots and context,
and the demo model's built-in Gemma chat format on both: llama-server with `--no-jinja
--chat-template gemma` (with Jinja on, `--chat-template gemma` would make the template the
literal text "gemma"). Before measuring, both render the same first request
(`POST /apply-template`) and the run stops if they differ.

Results go to bench/results/agents.json and bench/results/agents.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx

from bench.charts import write_chart
from bench.throughput import DEFAULT_MODEL, OUT, ROOT, free_port, wait_healthy

N_CTX = 16384


@dataclass
class Turn:
    user: int
    turn: int
    ttft: float  # seconds from sending to the first chunk with text
    prompt_tokens: int
    decoded: int  # prompt tokens the server evaluated (not read from its cache)


def system_prompt(words: int) -> str:
    """A long, deterministic system prompt: numbered rules, as agents' prompts are."""
    rules = [f"Rule {i}: when the task names file {i % 17}, check line {i * 7 % 101} first." for i in range(words // 12 + 1)]
    return "You are a careful coding assistant.\n" + "\n".join(rules)


def question(user: int, turn: int) -> str:
    return f"User {user}, turn {turn}: what should I change in file {(user * 5 + turn) % 17}?"


def _usage(chunk: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, decoded) from a final chunk: OpenAI's cached_tokens, or llama-server's
    timings (prompt_n: the tokens it evaluated)."""
    u = chunk.get("usage")
    if not u:
        return None
    prompt = int(u["prompt_tokens"])
    timings = chunk.get("timings")
    if isinstance(timings, dict) and "prompt_n" in timings:
        return prompt, int(timings["prompt_n"])
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return prompt, prompt - cached


def one_turn(
    client: httpx.Client, url: str, messages: list[dict[str, str]], reply: int, temperature: float = 0.0,
) -> tuple[float, str, tuple[int, int]]:
    body: dict[str, Any] = {
        "model": "demo", "messages": messages, "max_tokens": reply, "temperature": temperature, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if temperature:
        body["seed"] = 7
    sent = time.monotonic()
    ttft: float | None = None
    text: list[str] = []
    usage: tuple[int, int] | None = None
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - sent
                    text.append(piece)
            usage = _usage(chunk) or usage
    if usage is None:
        raise SystemExit(f"{url}: a stream without usage")
    return ttft if ttft is not None else time.monotonic() - sent, "".join(text), usage


def run_load(
    url: str, users: int, turns: int, system: str, reply: int
) -> tuple[list[Turn], float, dict[int, list[dict[str, str]]]]:
    results: list[Turn] = []
    conversations: dict[int, list[dict[str, str]]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def user(u: int) -> None:
        try:
            messages = [{"role": "system", "content": system}]
            conversations[u] = messages
            for t in range(turns):
                messages.append({"role": "user", "content": question(u, t)})
                # A connection per turn: llama-server (cpp-httplib) may close a kept-alive
                # one just as the next request goes out, and the turn fails.
                with httpx.Client() as client:
                    ttft, answer, (prompt, decoded) = one_turn(client, url, messages, reply)
                messages.append({"role": "assistant", "content": answer})
                with lock:
                    results.append(Turn(u, t, ttft, prompt, decoded))
        except BaseException as exc:  # reported after the others finish
            errors.append(exc)

    start = time.monotonic()
    threads = [threading.Thread(target=user, args=(u,)) for u in range(users)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results, time.monotonic() - start, conversations


def next_turns(url: str, conversations: dict[int, list[dict[str, str]]], users: list[int], turn: int, reply: int) -> list[Turn]:
    """One more turn for each of `users`, one after the other (an idle server)."""
    out = []
    for u in users:
        messages = conversations[u]
        messages.append({"role": "user", "content": question(u, turn)})
        with httpx.Client() as client:
            ttft, answer, (prompt, decoded) = one_turn(client, url, messages, reply)
        messages.append({"role": "assistant", "content": answer})
        out.append(Turn(u, turn, ttft, prompt, decoded))
    return out


def after_reload(url: str, conversations: dict[int, list[dict[str, str]]], turns: int, reply: int) -> dict[str, Any]:
    """Corral only: warm later turns on an idle server, then the same users' next turns
    after the model was unloaded (its worker writes the hottest prompts to disk) and loaded
    again (it reads them back). The load itself is timed apart: it is the model's, not the
    cache's."""
    users = sorted(conversations)[:3]
    warm = next_turns(url, conversations, users, turns, reply)
    httpx.post(url + "/models/unload", json={"model": "demo"}, timeout=60).raise_for_status()
    deadline = time.monotonic() + 120
    while httpx.get(url + "/admin/models/demo", timeout=10).json()["model"]["state"] != "stopped":
        if time.monotonic() > deadline:
            raise SystemExit("the model did not unload")
        time.sleep(0.1)
    t0 = time.monotonic()
    httpx.post(url + "/admin/models/demo/load", timeout=120).raise_for_status()
    load_s = time.monotonic() - t0
    cold = next_turns(url, conversations, users, turns + 1, reply)
    median = statistics.median
    return {
        "warm_ttft_median_s": median(t.ttft for t in warm),
        "reload_ttft_median_s": median(t.ttft for t in cold),
        "ratio": median(t.ttft for t in cold) / median(t.ttft for t in warm),
        "load_s": load_s,
        "warm": [asdict(t) for t in warm],
        "after_reload": [asdict(t) for t in cold],
    }


def summary(turns: list[Turn], wall: float) -> dict[str, Any]:
    def stats(xs: list[Turn]) -> dict[str, float]:
        ttfts = sorted(x.ttft for x in xs)
        p95 = ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))]
        return {"n": len(xs), "ttft_median_s": statistics.median(ttfts), "ttft_p95_s": p95}

    sent = sum(t.prompt_tokens for t in turns)
    decoded = sum(t.decoded for t in turns)
    return {
        "wall_s": wall,
        "first_turns": stats([t for t in turns if t.turn == 0]),
        "later_turns": stats([t for t in turns if t.turn > 0]),
        "prompt_tokens_sent": sent,
        "prompt_tokens_decoded": decoded,
        "decoded_fraction": decoded / sent if sent else 0.0,
        "turns": [asdict(t) for t in sorted(turns, key=lambda t: (t.user, t.turn))],
    }


def rendered(url: str, system: str) -> str:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question(0, 0)}]
    r = httpx.post(url + "/apply-template", json={"model": "demo", "messages": messages}, timeout=120)
    r.raise_for_status()
    return str(r.json()["prompt"])


def serve_corral(model: Path, slots: int, n_ctx: int = N_CTX, extra: str = "") -> tuple[subprocess.Popen[bytes], str]:
    """`corral serve` with the demo model as `demo` (the built-in Gemma format), a prompt
    cache folder of its own, and `extra` lines in its table."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    cfg = tmp / "config.toml"
    cfg.write_text(
        f'[server]\nport = {port}\n[supervisor]\nidle_timeout = 0\n'
        f'[models.demo]\npath = "{model}"\nslots = {slots}\nn_ctx = {n_ctx}\nchat_template = "gemma"\n'
        f'prompt_cache_dir = "{tmp / "prompt-cache"}"\n{extra}'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "--config", str(cfg)],
        cwd=ROOT, stdout=(tmp / "server.log").open("wb"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url + "/health", proc)
    return proc, url


def serve_llama(
    binary: Path, model: Path, slots: int, n_ctx: int = N_CTX, extra: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """llama-server with the same model, slots and format (`-kvu`), and `extra` arguments."""
    port = free_port()
    log = open(Path(tempfile.mkdtemp(prefix="llama-bench-")) / "server.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--port", str(port), "-np", str(slots), "-c", str(n_ctx), "-kvu",
         "--no-jinja", "--chat-template", "gemma", "-t", str(os.cpu_count()), "--no-webui", *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url + "/health", proc)
    return proc, url


def measure(
    proc: subprocess.Popen[bytes], url: str, args: argparse.Namespace, system: str, reload: bool = False
) -> tuple[dict[str, Any], str]:
    try:
        prompt = rendered(url, system)
        turns, wall, conversations = run_load(url, args.users, args.turns, system, args.reply)
        out = summary(turns, wall)
        if reload:
            out["reload"] = after_reload(url, conversations, args.turns, args.reply)
        return out, prompt
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def report(doc: dict[str, Any]) -> str:
    lines = [
        "# Agent-like load",
        "",
        f"{doc['users']} users on {doc['slots']} slots, {doc['turns']} turns each, one system prompt shared "
        f"by all (a first turn's prompt is {doc['first_prompt_tokens']} tokens), replies of at most {doc['reply']} tokens (greedy, streamed); "
        f"demo model, {doc['machine']['cpus']} CPUs, {doc['date']}. `python -m bench.agents {doc['command']}`",
        "",
        "| server | TTFT first turns, median / p95 | TTFT later turns, median / p95 | prompt tokens decoded / sent | wall |",
        "|---|---|---|---|---|",
    ]
    for name in ("corral", "llama-server"):
        r = doc.get(name)
        if r is None:
            continue
        f, later = r["first_turns"], r["later_turns"]
        lines.append(
            f"| {name} | {f['ttft_median_s']:.2f} s / {f['ttft_p95_s']:.2f} s | "
            f"{later['ttft_median_s']:.2f} s / {later['ttft_p95_s']:.2f} s | "
            f"{r['prompt_tokens_decoded']} / {r['prompt_tokens_sent']} ({r['decoded_fraction']:.0%}) | {r['wall_s']:.1f} s |"
        )
    r = doc.get("corral", {}).get("reload")
    if r:
        decoded = sum(t["decoded"] for t in r["after_reload"])
        sent = sum(t["prompt_tokens"] for t in r["after_reload"])
        lines += [
            "",
            f"Corral, {len(r['warm'])} users' next turns on the idle server: TTFT median {r['warm_ttft_median_s']:.2f} s; "
            f"their next turns after the model was unloaded and loaded again ({r['load_s']:.1f} s, not counted): "
            f"{r['reload_ttft_median_s']:.2f} s ({r['ratio']:.2f}x), {decoded} of {sent} prompt tokens decoded.",
        ]
    if "ratios" in doc:
        q = doc["ratios"]
        lines += [
            "",
            f"Corral / llama-server: later-turn TTFT median {q['later_ttft_median']:.2f}x, wall {q['wall']:.2f}x.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--users", type=int, default=6)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--system-words", type=int, default=780, help="about 1,500 tokens with the demo model")
    ap.add_argument("--reply", type=int, default=16)
    ap.add_argument("--llama-server", type=Path, default=None, help="llama-server, built from the same llama.cpp")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    model = args.model.resolve()
    if not model.is_file():
        raise SystemExit(f"model not found: {model} (run `make model`)")
    system = system_prompt(args.system_words)
    corral, corral_prompt = measure(*serve_corral(model, args.slots), args, system, reload=True)
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "command": " ".join(sys.argv[1:]),
        "users": args.users, "slots": args.slots, "turns": args.turns, "reply": args.reply,
        "first_prompt_tokens": corral["turns"][0]["prompt_tokens"],
        "corral": corral,
    }
    if args.llama_server is not None:
        llama, llama_prompt = measure(*serve_llama(args.llama_server, model, args.slots), args, system)
        if llama_prompt != corral_prompt:
            raise SystemExit(
                "llama-server renders the conversation differently from Corral; the figures would not compare:\n"
                f"llama-server: {llama_prompt[:300]!r}\ncorral: {corral_prompt[:300]!r}"
            )
        doc["llama-server"] = llama
        doc["ratios"] = {
            "later_ttft_median": corral["later_turns"]["ttft_median_s"] / llama["later_turns"]["ttft_median_s"],
            "wall": corral["wall_s"] / llama["wall_s"],
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agents.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = report(doc)
    (args.out / "agents.md").write_text(md)
    write_chart(args.out / "agents.json")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
