"""Does another client's huge prompt stall a running stream? (issue 8, finding 3)

  python -m bench.hostile_prompt [--model PATH] [--repeat 3] [--llama-server PATH [--llama-server-repeat 1]]

`corral serve` with the demo model (4 slots, n_ctx 4096, 2 threads). One client streams a
greedy completion and timestamps every token event. Meanwhile other clients send, one after
another, chat requests whose prompts cannot fit:

- 150 KB: under the byte bound, so it is really tokenized (on the preparing thread), then
  refused by its token count;
- 1 MB and 15 MB: over the byte bound, so they are refused from their length alone.

For each, it reports the time to the 400, and the stream's largest inter-token gap while
that request was in flight, against the stream's median gap (one decode step). The target
is a gap below 2 steps, and under 100 ms to the 400 for the 15 MB body. Before the fix, the
1 MB prompt froze the stream for 2.9 s and the 15 MB one took 21.7 s to be refused.

The controls: while the Corral stream runs, the same bodies go to bare ASGI apps on
hypercorn's trio worker (bench/bare_asgi.py) that answer 400 after only receiving them, or
after receiving and parsing them as JSON. Their rows are the floors that the stack and this
machine's CPU set: on 2 cores, with the worker's 2 decode threads busy, merely receiving
15 MB in another process stretches the stream's steps.

With --llama-server, llama.cpp's own server (4 slots, unified 4096-cell KV, no repacking,
2 threads, the built-in gemma template) takes the same requests in the same run.

Results go to bench/results/hostile_prompt.json and bench/results/hostile_prompt.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import httpx

from bench.charts import write_chart
from bench.throughput import DEFAULT_MODEL, OUT, ROOT, free_port, wait_healthy

SIZES = (("150 KB", 150_000), ("1 MB", 1_000_000), ("15 MB", 15_000_000))
STREAM_TOKENS = 2000
CONTROLS = {  # row name: the app in bench/bare_asgi.py
    "control: bare app, receives": "app",
    "control: bare app, receives and parses": "parsing_app",
}


def body(n_bytes: int) -> bytes:
    words = "the quick brown fox jumps over the lazy dog "
    content = (words * (n_bytes // len(words) + 1))[:n_bytes]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()


class Stream:
    """A greedy stream, read in a process of its own, that timestamps every token event
    until stopped. Its own process: the client that sends 15 MB holds its interpreter for
    tens of milliseconds at a time, and a stream timed in the same process would show
    that as a gap the server never caused. time.monotonic() is one clock across
    processes."""

    def __init__(self, url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._started = ctx.Event()
        self._out: multiprocessing.Queue[tuple[list[float], str | None]] = ctx.Queue()
        self._proc = ctx.Process(target=_stream, args=(url, self._stop, self._started, self._out), daemon=True)

    def start(self) -> None:
        self._proc.start()
        if not self._started.wait(120):
            raise RuntimeError("the stream did not start")

    def stop(self) -> list[float]:
        self._stop.set()
        times, error = self._out.get(timeout=60)
        self._proc.join(timeout=10)
        if error is not None:
            raise RuntimeError(f"the stream failed: {error}")
        return times


def _stream(url: str, stop: Any, started: Any, out: Any) -> None:
    req = {
        "model": "m", "prompt": "Once upon a time", "max_tokens": STREAM_TOKENS,
        "temperature": 0, "ignore_eos": True, "stream": True,
    }
    times: list[float] = []
    error = None
    try:
        with httpx.stream("POST", url + "/v1/completions", json=req, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
                    if len(times) == 50:  # past the prompt, into steady decoding
                        started.set()
                if stop.is_set():
                    break  # closing the response cancels the generation
    except Exception as exc:  # reported by the parent
        error = repr(exc)
    out.put((times, error))


def max_gap(times: list[float], start: float, end: float) -> float:
    """The largest gap between consecutive events that ends inside [start, end + one gap]."""
    gaps = [b - a for a, b in zip(times, times[1:]) if start <= b and a <= end]
    return max(gaps, default=0.0)


def answer(doc: dict[str, Any]) -> str:
    """The error's code (llama-server: its type), or what a 200 made of the prompt."""
    err = doc.get("error") or {}
    if err:
        return str(err.get("code") if isinstance(err.get("code"), str) else err.get("type"))
    usage, choice = doc.get("usage") or {}, (doc.get("choices") or [{}])[0]
    return f"prompt_tokens {usage.get('prompt_tokens')}, finish {choice.get('finish_reason')}"


def run_once(url: str, target: str | None = None) -> list[dict[str, float | str | int]]:
    """One stream from `url` while the huge prompts go to `target` (by default `url` too)."""
    target = target or url
    bodies = [(label, body(n)) for label, n in SIZES]  # built before the stream starts
    stream = Stream(url)
    stream.start()
    client = httpx.Client(timeout=600)
    rows: list[dict[str, float | str | int]] = []
    for label, data in bodies:
        time.sleep(0.5)  # steady decoding between hostile requests
        t0 = time.monotonic()
        r = client.post(target + "/v1/chat/completions", content=data, headers={"content-type": "application/json"})
        t1 = time.monotonic()
        code = answer(r.json())
        rows.append({"prompt": label, "status": r.status_code, "code": code, "to_400_ms": (t1 - t0) * 1000, "start": t0, "end": t1})
    time.sleep(0.5)
    times = stream.stop()
    client.close()
    step = statistics.median(b - a for a, b in zip(times, times[1:]))
    for row in rows:
        if times[-1] < float(row["end"]):  # the stream had ended: no gap to measure
            row.update(gap_ms=-1.0, median_step_ms=step * 1000, gap_in_steps=-1.0)
        else:
            gap = max_gap(times, float(row["start"]), float(row["end"]))
            row.update(gap_ms=gap * 1000, median_step_ms=step * 1000, gap_in_steps=gap / step)
        del row["start"], row["end"]
    return rows


@contextmanager
def corral(model: str, tmp: Path) -> Iterator[str]:
    port = free_port()
    cfg = tmp / "config.toml"
    cfg.write_text(
        f'[server]\nport = {port}\nmax_body_bytes = 33554432\n[supervisor]\nidle_timeout = 0\n'
        f'[models.m]\npath = "{model}"\nslots = 4\nn_ctx = 4096\nthreads = 2\n'
        'chat_template = "gemma"\n'
    )
    with open(tmp / "corral.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "corral", "serve", "--config", str(cfg)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        yield from _serving(proc, f"http://127.0.0.1:{port}")


@contextmanager
def llama_server(binary: str, model: str, tmp: Path) -> Iterator[str]:
    port = free_port()
    with open(tmp / "llama-server.log", "wb") as log:
        proc = subprocess.Popen(
            [binary, "-m", model, "--port", str(port), "-np", "4", "-c", "4096", "-kvu", "-nr",
             "-t", "2", "--chat-template", "gemma", "--no-webui"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        yield from _serving(proc, f"http://127.0.0.1:{port}")


@contextmanager
def bare_asgi(app: str, tmp: Path) -> Iterator[str]:
    port = free_port()
    with open(tmp / "bare.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypercorn", "--worker-class", "trio", "--bind", f"127.0.0.1:{port}",
             f"bench.bare_asgi:{app}"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
        yield from _serving(proc, f"http://127.0.0.1:{port}")


def _serving(proc: subprocess.Popen[bytes], url: str) -> Iterator[str]:
    try:
        wait_healthy(url + "/health", proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def summarize(runs: list[list[dict[str, float | str | int]]]) -> list[dict[str, Any]]:
    summary: list[dict[str, Any]] = []
    for i, (label, _) in enumerate(SIZES):
        rows = [run[i] for run in runs]
        gaps = [float(r["gap_in_steps"]) for r in rows if float(r["gap_in_steps"]) >= 0]
        summary.append({
            "prompt": label,
            "statuses": sorted({int(r["status"]) for r in rows}),
            "codes": sorted({str(r["code"]) for r in rows}),
            "to_400_ms_max": max(float(r["to_400_ms"]) for r in rows),
            "to_400_ms_median": statistics.median(float(r["to_400_ms"]) for r in rows),
            "gap_in_steps_median": statistics.median(gaps) if gaps else None,  # None: the stream had ended
            "gap_in_steps_max": max(gaps) if gaps else None,
            "median_step_ms": statistics.median(float(r["median_step_ms"]) for r in rows),
        })
    return summary


def report(result: dict[str, Any]) -> str:
    """The Markdown table of a result (bench/results/hostile_prompt.json)."""
    servers = {k: v for k, v in result.items() if isinstance(v, dict)}
    runs = ", ".join(f"{len(v['runs'])} of {k}" for k, v in servers.items())
    lines = [
        f"Measured {result['date']} on {result['machine']}; runs: {runs}. Demo model, 4 slots, "
        "n_ctx 4096, 2 threads. A greedy stream runs while another client sends each prompt; "
        "the controls get the prompts while the Corral stream runs.",
        "",
        "| server | prompt | answer | time to the answer (median / max) | stream's largest gap meanwhile (median / max over runs) | median step |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name, v in servers.items():
        for row in summarize(v["runs"]):
            gap = (
                f"{row['gap_in_steps_median']:.2f} / {row['gap_in_steps_max']:.2f} steps"
                if row["gap_in_steps_max"] is not None else "(stream had ended)"
            )
            lines.append(
                f"| {name} | {row['prompt']} | {'/'.join(map(str, row['statuses']))} {', '.join(row['codes'])} "
                f"| {row['to_400_ms_median']:.0f} / {row['to_400_ms_max']:.0f} ms "
                f"| {gap} | {row['median_step_ms']:.1f} ms |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llama-server", default=None, help="a llama-server binary to measure the same way")
    ap.add_argument("--llama-server-repeat", type=int, default=1,
                    help="its runs (each takes minutes: it reads every prompt)")
    ap.add_argument("--report", action="store_true", help="only rewrite the table from the last JSON")
    args = ap.parse_args()
    if args.report:
        md = report(json.loads((OUT / "hostile_prompt.json").read_text()))
        (OUT / "hostile_prompt.md").write_text(md)
        write_chart(OUT / "hostile_prompt.json")
        print(md, end="")
        return
    servers = {"corral": partial(corral, args.model)}
    if args.llama_server:
        servers["llama-server"] = partial(llama_server, args.llama_server, args.model)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, serve in servers.items():
            with serve(Path(tmp)) as url:
                repeat = args.llama_server_repeat if name == "llama-server" else args.repeat
                runs = [run_once(url) for _ in range(repeat)]
                results[name] = {"runs": runs, "summary": summarize(runs)}
                if name == "corral":  # the controls: the same bodies to bare apps, Corral streaming
                    for control, app in CONTROLS.items():
                        with bare_asgi(app, Path(tmp)) as bare:
                            runs = [run_once(url, bare) for _ in range(args.repeat)]
                        results[control] = {"runs": runs, "summary": summarize(runs)}
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        **results,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "hostile_prompt.json").write_text(json.dumps(result, indent=2) + "\n")
    md = report(result)
    (OUT / "hostile_prompt.md").write_text(md)
    write_chart(OUT / "hostile_prompt.json")
    print(md, end="")


if __name__ == "__main__":
    main()
