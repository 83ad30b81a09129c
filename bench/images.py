"""Do image requests stall the other streams? Corral against llama.cpp's llama-server, same
model, same projector, same requests, one run (issue 42, item 4).

  python -m bench.images [--llama-server PATH] [--size siglip|tiny] [--streams 2]
                         [--images 4] [--tokens 300]

llama-server encodes an image inside its main loop, so every running stream waits for the
whole encode; Corral encodes on a thread beside the step loop (worker/media/encoder.py). The
projector is a random-weight one of realistic size (bench/projector.py: SigLIP-400M's shapes,
896-pixel images, 256 image tokens; made once into models/, not in CI), for the demo model.

Per server: `--streams` greedy text streams of `--tokens` tokens run; once each has sent
some tokens, `--images` chat requests with an image each (a different one every time, so
that nothing is cached) are sent one after another, each for one token. Reported:

- the running streams' gaps between tokens: the median over the run, and the worst while
  images arrived, and worst / median (the target: within 2x for Corral);
- each image request's time to its first token (encode and prefill), and images encoded a
  second (images / the time from the first image sent to the last answered).

Results go to bench/results/images.json and .md.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np

from bench import projector
from bench.throughput import DEFAULT_MODEL, OUT, free_port, start_corral, wait_healthy

ROOT = Path(__file__).resolve().parents[1]


def image(seed: int, side: int) -> str:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def projector_file(size: str) -> Path:
    path = ROOT / "models" / f"mmproj-bench-{size}.gguf"
    if not path.is_file():
        print(f"writing {path} (random weights, {size} shapes) ...", flush=True)
        projector.write(path, size)
    return path


@contextlib.contextmanager
def corral(model: Path, mmproj: Path) -> Iterator[str]:
    proc, port = start_corral(
        "[server]\nport = {PORT}\n[supervisor]\nidle_timeout = 0\n"
        f'[models.demo]\npath = "{model}"\nmmproj = "{mmproj}"\nchat_template = "gemma"\nslots = 4\nn_ctx = 4096\n'
        'spec_type = "none"\n',
        prefix="corral-images-",
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@contextlib.contextmanager
def llama_server(binary: Path, model: Path, mmproj: Path) -> Iterator[str]:
    port = free_port()
    log = open(Path(tempfile.mkdtemp(prefix="llama-server-images-")) / "server.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--mmproj", str(mmproj), "--port", str(port), "-np", "4", "-c", "4096",
         "-kvu", "-nr", "-t", str(os.cpu_count()), "--no-webui", "--chat-template", "gemma"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def stream(url: str, i: int, tokens: int, stamps: list[float], started: threading.Event) -> None:
    body = {
        "model": "demo", "prompt": f"Story {i}: once upon a time, in a valley far away,", "max_tokens": tokens,
        "temperature": 0, "ignore_eos": True, "stream": True,
    }
    with httpx.Client(timeout=600) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:]).get("choices"):
                    stamps.append(time.perf_counter())
                    if len(stamps) == 20:
                        started.set()


def ask_image(url: str, seed: int, side: int) -> float:
    body = {
        "model": "demo", "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": image(seed, side)}},
        ]}],
    }
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0


def measure(url: str, streams: int, images: int, tokens: int, side: int, seed0: int) -> dict[str, Any]:
    ask_image(url, seed0 - 1, side)  # warm: the projector's first graph
    stamps: list[list[float]] = [[] for _ in range(streams)]
    started = [threading.Event() for _ in range(streams)]
    threads = [threading.Thread(target=stream, args=(url, i, tokens, stamps[i], started[i])) for i in range(streams)]
    for t in threads:
        t.start()
    for e in started:
        e.wait(120)
    t_first = time.perf_counter()
    ttft = [ask_image(url, seed0 + k, side) for k in range(images)]
    t_last = time.perf_counter()
    for t in threads:
        t.join()
    gaps, during = [], []
    for s in stamps:
        for a, b in zip(s, s[1:]):
            gaps.append(b - a)
            if a >= t_first and b <= t_last + 1.0 or a <= t_first <= b or a <= t_last <= b:
                during.append(b - a)
    median = statistics.median(gaps)
    worst = max(during) if during else 0.0
    return {
        "median_gap_ms": median * 1000, "worst_gap_ms": worst * 1000, "worst_over_median": worst / median,
        "image_first_token_s": ttft, "images_per_s": images / (t_last - t_first),
        "streams_done": all(len(s) >= tokens for s in stamps),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", type=Path, default=None)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--size", choices=sorted(projector.SIZES), default="siglip")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=300)
    a = ap.parse_args()
    mmproj = projector_file(a.size)
    side = projector.SIZES[a.size].image_size
    results: dict[str, Any] = {}
    with corral(a.model, mmproj) as url:
        results["corral"] = measure(url, a.streams, a.images, a.tokens, side, 1000)
    if a.llama_server is not None:
        with llama_server(a.llama_server, a.model, mmproj) as url:
            results["llama-server"] = measure(url, a.streams, a.images, a.tokens, side, 1000)
    setup = {"size": a.size, "streams": a.streams, "images": a.images, "tokens": a.tokens, "cpus": os.cpu_count()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "images.json").write_text(json.dumps({"setup": setup, "results": results}, indent=2) + "\n")
    lines = [
        f"Image requests beside {a.streams} running text streams ({a.images} images of {side} px, "
        f"{a.size} projector, {os.cpu_count()} CPUs), one run:",
        "",
        "| server | median gap ms | worst gap ms while images arrived | worst / median | image first token s (median) | images / s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['median_gap_ms']:.1f} | {r['worst_gap_ms']:.1f} | {r['worst_over_median']:.2f} "
            f"| {statistics.median(r['image_first_token_s']):.2f} | {r['images_per_s']:.3f} |"
        )
    (OUT / "images.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
