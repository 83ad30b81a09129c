"""deploy/nginx/ and deploy/haproxy/, run by the real nginx and HAProxy in front of two Corral
processes (issue 25): a stream's events reach the client as Corral sends them, a session
stays on one host, requests without a session spread, and a host that goes away is routed
around. Each configuration runs as it stands in deploy/, with only the addresses changed.

Both are Debian's (`make system-packages` installs them); a balancer that is not installed
is skipped, saying so."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ROOT, Server, free_port, start_server, stop_server, die_with_the_tests

PLACEHOLDERS = ("127.0.0.1:8081", "127.0.0.1:8082")

BACKEND = """
[server]
port = {PORT}

[supervisor]
idle_timeout = 0

[models.demo]
path = "{MODEL}"
slots = 2
n_ctx = 1024
chat_template = "gemma"
"""


def binary(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}",) if os.access(p, os.X_OK)), None)


def nginx_args(tmp: Path, port: int, conf: str) -> list[str]:
    assert "listen 8080;" in conf
    (tmp / "corral.conf").write_text(conf.replace("listen 8080;", f"listen 127.0.0.1:{port};"))
    temp_paths = "\n".join(
        f"    {kind}_temp_path {tmp}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (tmp / "nginx.conf").write_text(
        ("user root;\n" if os.geteuid() == 0 else "")
        + f"daemon off;\nworker_processes 1;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log warn;\n"
        + "events { worker_connections 64; }\n"
        + f"http {{\n    access_log {tmp}/access.log;\n{temp_paths}\n    include {tmp}/corral.conf;\n}}\n"
    )
    # -e: the error log from the start, before the config is read (else nginx first opens
    # /var/log/nginx/error.log, which only root may).
    return [str(binary("nginx")), "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(tmp / "nginx.conf")]


def haproxy_args(tmp: Path, port: int, conf: str) -> list[str]:
    assert "bind 127.0.0.1:8080" in conf
    (tmp / "haproxy.cfg").write_text(conf.replace("bind 127.0.0.1:8080", f"bind 127.0.0.1:{port}"))
    return [str(binary("haproxy")), "-db", "-f", str(tmp / "haproxy.cfg")]  # -db: in the foreground


BALANCERS = {
    "nginx": (ROOT / "deploy" / "nginx" / "corral-replicas.conf", nginx_args, "-t", signal.SIGQUIT),
    "haproxy": (ROOT / "deploy" / "haproxy" / "corral-replicas.cfg", haproxy_args, "-c", signal.SIGUSR1),
}


def requests_served(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "corral_requests_total" and s.labels.get("endpoint") == "/v1/chat/completions"
    )


@pytest.fixture(scope="module", params=sorted(BALANCERS))
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Server]]]:
    name = request.param
    conf_path, make_args, check_flag, stop_signal = BALANCERS[name]
    if binary(name) is None:
        pytest.skip(f"{name} is not installed (Debian's {name}: `make system-packages` installs it)")
    backs = [start_server(tmp_path_factory.mktemp(f"{name}-back{i}"), BACKEND) for i in range(2)]
    tmp = tmp_path_factory.mktemp(name)
    port = free_port()
    conf = conf_path.read_text()
    for placeholder, back in zip(PLACEHOLDERS, backs):
        assert placeholder in conf
        conf = conf.replace(placeholder, back.url.removeprefix("http://"))
    args = make_args(tmp, port, conf)
    check = subprocess.run([*args, check_flag], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log = (tmp / "balancer.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_the_tests)
    url = f"http://127.0.0.1:{port}"
    for back in backs:  # each loads its model now, not in the middle of a measured stream
        assert chat(back.url, None).status_code == 200
    try:
        deadline = time.monotonic() + 15
        while True:  # up, and (HAProxy) both backends in rotation after their first check
            try:
                if all(httpx.get(url + "/health", timeout=1).status_code == 200 for _ in range(4)):
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, (tmp / "balancer.log").read_text()
            time.sleep(0.2)
        yield url, backs
    finally:
        proc.send_signal(stop_signal)  # each one's graceful stop
        proc.wait(timeout=10)
        for back in backs:
            if back.process.poll() is None:
                stop_server(back)


def chat(url: str, session: str | None, tokens: int = 1) -> httpx.Response:
    headers = {"x-session-id": session} if session else {}
    return httpx.post(
        url + "/v1/chat/completions", headers=headers, timeout=120,
        json={"model": "demo", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": tokens},
    )


def arrivals(url: str) -> list[float]:
    """When each of a stream's events reached the client, in seconds from the response."""
    body = {
        "model": "demo", "stream": True, "max_tokens": 48, "ignore_eos": True, "temperature": 1.0, "seed": 7,
        "messages": [{"role": "user", "content": "Tell me a story."}],
    }
    out: list[float] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        t0 = time.monotonic()
        for chunk in r.iter_raw():
            out += [time.monotonic() - t0] * chunk.count(b"data:")
    return out


def test_a_stream_reaches_the_client_as_corral_sends_it(fleet: tuple[str, list[Server]]) -> None:
    url, backs = fleet
    for times in (arrivals(backs[0].url), arrivals(url)):  # direct, then through the balancer
        # Buffered, the events would reach the client in a burst at the end; passed on as
        # they come, they arrive all along the generation: most of them well before the
        # last one, in several bursts. (Not "half of them in the first half": on a busy
        # machine the prompt alone can take half the time; and not "one moment per token":
        # on a busy machine a step's events, or a few steps', come out together.)
        assert len(times) >= 40, times
        assert sum(t < times[-1] - 0.1 for t in times) >= len(times) // 2, times
        assert len({round(t, 2) for t in times}) >= 4, times


def test_a_session_stays_on_one_host_and_sessions_spread(fleet: tuple[str, list[Server]]) -> None:
    url, backs = fleet
    before = [requests_served(b) for b in backs]
    for _ in range(6):
        assert chat(url, "conversation-7").status_code == 200
    after = [requests_served(b) for b in backs]
    assert sorted(a - b for a, b in zip(after, before)) == [0, 6]
    for i in range(16):  # 16 sessions on one host: 1 chance in 32,768 with two hosts
        assert chat(url, f"user-{i}").status_code == 200
    spread = [requests_served(b) - a for a, b in zip(after, backs)]
    assert sum(spread) == 16 and min(spread) > 0, spread


def test_a_host_that_goes_away_is_routed_around(fleet: tuple[str, list[Server]]) -> None:
    url, backs = fleet
    # The session's own host stops; its requests go to the other one, none fails.
    before = [requests_served(b) for b in backs]
    assert chat(url, "conversation-9").status_code == 200
    home = next(i for i, b in enumerate(backs) if requests_served(b) > before[i])
    stop_server(backs[home])
    other = backs[1 - home]
    served = requests_served(other)
    for _ in range(4):
        assert chat(url, "conversation-9").status_code == 200
    assert requests_served(other) == served + 4
