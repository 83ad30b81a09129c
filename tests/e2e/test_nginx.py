"""deploy/nginx/corral-replicas.conf, run by the real nginx in front of two Corral processes
(issue 25): a stream's events reach the client as Corral sends them, a session stays on one
host, requests without a session spread, and a host that goes away is routed around.

nginx is Debian's (`make system-packages` installs it); without it these tests are
skipped, saying so."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ROOT, Server, free_port, start_server, stop_server

CONF = ROOT / "deploy" / "nginx" / "corral-replicas.conf"
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)

pytestmark = pytest.mark.skipif(
    NGINX is None, reason="nginx is not installed (Debian's nginx: `make system-packages` installs it)"
)

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


def requests_served(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "corral_requests_total" and s.labels.get("endpoint") == "/v1/chat/completions"
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Server]]]:
    backs = [start_server(tmp_path_factory.mktemp(f"back{i}"), BACKEND) for i in range(2)]
    tmp = tmp_path_factory.mktemp("nginx")
    port = free_port()
    conf = CONF.read_text()
    for placeholder, back in zip(("127.0.0.1:8081", "127.0.0.1:8082"), backs):
        assert placeholder in conf
        conf = conf.replace(placeholder, back.url.removeprefix("http://"))
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
    args = [str(NGINX), "-p", str(tmp), "-c", str(tmp / "nginx.conf")]
    check = subprocess.run([*args, "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp / "error.log").read_text()
            time.sleep(0.1)
        yield url, backs
    finally:
        proc.send_signal(signal.SIGQUIT)  # nginx's graceful stop
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
    for times in (arrivals(backs[0].url), arrivals(url)):  # direct, then through nginx
        # Buffered, the events would reach the client in a burst at the end; passed on as
        # they come, they arrive all along the generation: a good part in its first half,
        # at many separate moments.
        assert len(times) >= 40, times
        half = (times[0] + times[-1]) / 2
        assert sum(t < half for t in times) >= len(times) // 4, times
        assert len({round(t, 2) for t in times}) >= 10, times


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
