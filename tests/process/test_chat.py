"""`corral chat` with fake workers: in-process replies through the chat route's own path
(corral/chat/in_process.py), the terminal over --url in a pty, and the ways a careless operator
or a hostile server gets it wrong."""

from __future__ import annotations

import http.server
import re
import io
import os
import threading
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from functools import partial
from unittest import mock
from pathlib import Path
from typing import Any, Iterator

import pytest
import trio

from corral.chat.over_http import HttpChat
from corral.chat.in_process import LocalChat, only_model
from corral.chat.session import ChatError, Event, Finished, Piece, ReplyOptions, request_body
from corral.main import main
from corral.serve import serve
from supervisor.config import load
from supervisor.supervisor import Supervisor
from tests import chat_terminal as term
from tests.harness import make_config, write_config
from tests.process.support import WORKER_COMMAND, expected_text, serving_http, wait_for
from tests.secrets import secret

KEY = secret("chat")


def _body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = request_body("alias-a", [{"role": "user", "content": "hi"}], ReplyOptions(max_tokens=max_tokens))
    return {**body, **extra}


def _text(events: Iterator[Event]) -> tuple[str, Finished | None]:
    pieces, last = [], None
    for ev in events:
        if isinstance(ev, Piece):
            pieces.append(ev.text)
        else:
            last = ev
    return "".join(pieces), last


def _within(seconds: float, fn: Any) -> Any:
    """fn() on a thread, failing the test if it has not returned in time: a reply that
    waits for a slot nobody frees would otherwise hang the suite."""
    result: list[Any] = []
    failed: list[BaseException] = []

    def call() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    if failed:
        raise failed[0]
    assert result, f"no answer within {seconds}s"
    return result[0]


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalChat]:
    cfg = make_config(tmp_path, {"a": {"aliases": ["alias-a"], "slots": 1}, "b": {"preload": True}})
    chat = LocalChat(cfg, "alias-a", worker_command=WORKER_COMMAND)
    try:
        chat.start()
        yield chat
    finally:
        chat.close()


def test_in_process_the_config_is_cut_to_the_one_model(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, {"a": {"aliases": ["alias-a"]}, "b": {"preload": True}, "e": {"embeddings": True}})
    only = only_model(cfg, "alias-a")
    assert list(only.models) == ["a"] and only.models["a"].idle_timeout == 0
    with pytest.raises(ChatError, match=r"no model 'zzz' \(its models: a, b, e\)"):
        only_model(cfg, "zzz")
    with pytest.raises(ChatError, match="embeddings only"):
        only_model(cfg, "e")


def test_in_process_a_reply_streams_from_the_worker_and_only_its_model_loads(
    local: LocalChat, start_log: Any
) -> None:
    text, fin = _within(30, lambda: _text(local.reply(_body(5))))
    assert text == expected_text(5)
    assert fin == Finished("length", 5)
    # "b" is preloaded in the file; the chat started only the model it talks to.
    assert start_log.names() == ["a"]


def test_in_process_a_bad_option_is_refused_as_the_route_refuses_it(local: LocalChat) -> None:
    with pytest.raises(ChatError, match="temperature"):
        _within(30, lambda: _text(local.reply(_body(5, temperature=5.0))))
    # The chat goes on after it.
    assert _within(30, lambda: _text(local.reply(_body(2))))[0] == expected_text(2)


def test_in_process_stopping_a_reply_frees_its_slot(local: LocalChat, monkeypatch: pytest.MonkeyPatch) -> None:
    events = local.reply(_body(100_000))
    first = next(events)
    assert first == Piece("tok0")
    events.close()  # what Ctrl-C does: returns once the generation has let go
    # One slot: the next reply gets it only if the stopped one gave it back.
    assert _within(30, lambda: _text(local.reply(_body(3))))[0] == expected_text(3)


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def _chat(*args: str, env: dict[str, str] | None = None) -> Done:
    """`corral chat ARGS` run in this process (the import of a fresh one costs a second
    or two each), with no terminal and only the CORRAL_ variables of `env`."""
    out, err = io.StringIO(), io.StringIO()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    with mock.patch.dict(os.environ, {**clean, **(env or {})}, clear=True), \
            redirect_stdout(out), redirect_stderr(err), mock.patch("sys.stdin", io.StringIO()):
        try:
            code = main(["chat", *args])
        except SystemExit as exc:  # argparse's own refusals
            code = int(exc.code or 0)
    return Done(code, out.getvalue(), err.getvalue())


def test_careless_command_lines_get_one_clear_line_each(tmp_path: Path) -> None:
    cases = [
        (["a", "--url", "http://127.0.0.1:1", "--config", "x.toml"], "not both"),
        (["a", "--url", "ftp://host"], "expected http://HOST"),
        (["a", "--url", "http://127.0.0.1:1"], "cannot reach http://127.0.0.1:1"),
        (["a", "--max-tokens", "0", "--url", "http://127.0.0.1:1"], "--max-tokens: must be from 1 to"),
        (["a", "--max-tokens", str(2**31), "--url", "http://127.0.0.1:1"], "--max-tokens: must be from 1 to"),
        (["a", "--url", "http://me:sk-pass@127.0.0.1:1"], "user:password@ in it is refused"),
        (["a", "--url", "http://127.0.0.1:99999"], "--url: not a URL"),
        (["a", "--api-key"], "never a command-line argument"),
        (["a", "--temperature", "nan", "--url", "http://127.0.0.1:1"], "--temperature: must be from 0 to 2"),
        (["a", "--url", "http://127.0.0.1:1", "--api-key-file", str(tmp_path / "none")], "--api-key-file: cannot read"),
        (["a", "--config", str(tmp_path / "missing.toml")], "missing.toml"),
    ]
    for args, says in cases:
        done = _chat(*args)
        assert done.returncode == 1, (args, done.stderr)
        assert says in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and "sk-pass" not in done.stderr, (args, done.stderr)


def test_corral_url_from_the_environment_unless_a_config_is_named(tmp_path: Path) -> None:
    env = {"CORRAL_URL": "http://127.0.0.1:1"}
    over_env = _chat("a", env=env)
    assert over_env.returncode == 1
    assert "chatting over http://127.0.0.1:1 ($CORRAL_URL)" in over_env.stderr
    assert "cannot reach http://127.0.0.1:1" in over_env.stderr
    secret_url = _chat("a", env={"CORRAL_URL": "http://me:sk-pass@127.0.0.1:1"})
    assert secret_url.returncode == 1 and "sk-pass" not in secret_url.stderr
    named = _chat("a", "--config", str(tmp_path / "missing.toml"), env=env)
    assert named.returncode == 1 and "missing.toml" in named.stderr and "127.0.0.1:1" not in named.stderr


async def test_over_url_wrong_key_unknown_model_and_the_key_never_shown(tmp_path: Path) -> None:
    path = write_config(tmp_path / "config.toml", {"a": {}}, {"api_keys": [KEY], "port": 0})
    wrong = tmp_path / "wrong.key"
    wrong.write_text("# a comment first\n" + secret("wrong") + "\n")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, load(path), worker_command=WORKER_COMMAND))
            url = binds[0]
            refused = await trio.to_thread.run_sync(lambda: _chat("a", "--url", url, "--api-key-file", str(wrong)))
            unknown = await trio.to_thread.run_sync(lambda: _chat("zzz", "--url", url, env={"CORRAL_API_KEY": KEY}))
            nursery.cancel_scope.cancel()
    assert refused.returncode == 1 and "refused the API key" in refused.stderr
    assert unknown.returncode == 1 and "has no model 'zzz'" in unknown.stderr
    plain = _chat("a", "--url", "http://127.0.0.1:1", "--api-key", KEY)
    assert plain.returncode == 1 and "never a command-line argument" in plain.stderr
    as_file = _chat("a", "--url", "http://127.0.0.1:1", "--api-key-file", KEY)  # a key where a path goes
    assert as_file.returncode == 1 and "cannot read the file" in as_file.stderr
    for done in (refused, unknown, plain, as_file):
        assert secret("wrong") not in done.stderr + done.stdout and KEY not in done.stderr + done.stdout


async def test_over_url_in_a_terminal_two_turns_ctrl_c_mid_reply_then_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acceptance dialogue against a server with fake workers. One slot: the turn
    after a Ctrl-C gets it only if closing the stream freed it."""
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "40")
    path = write_config(tmp_path / "config.toml", {"a": {"slots": 1}}, {"api_keys": [KEY], "port": 0})
    key_file = tmp_path / "chat.key"
    key_file.write_text(KEY + "\n")
    max_tokens = 60  # 1.5 s a reply: long enough to be cut, short enough to wait for
    sup = Supervisor(load(path), worker_command=WORKER_COMMAND)

    def dialogue(url: str) -> tuple[list[term.Turn], str, str, int]:
        child = term.spawn(["a", "--url", url, "--api-key-file", str(key_file), "--max-tokens", str(max_tokens)])
        child.expect_exact("/exit or Ctrl-D to leave")
        term.wait_for_prompt(child)
        child.sendintr()  # at the prompt: a hint, not an exit
        child.expect_exact("/exit or Ctrl-D leaves")
        term.wait_for_prompt(child)
        turns = [term.say(child, "first question"), term.say(child, "second question")]
        turns.append(term.say_and_interrupt(child, "a long answer please"))
        after_cut = term.quiet_for(child, 1.0)
        # The server saw its client leave and cancelled the generation.
        trio.from_thread.run(wait_for, lambda: sup.handles["a"].in_flight == 0, 10, "the cut reply to end")
        turns.append(term.say(child, "after the cut"))
        return turns, after_cut, str(child.before), term.leave(child)

    with trio.fail_after(120):
        async with serving_http(sup) as url:
            turns, after_cut, _, status = await trio.to_thread.run_sync(dialogue, url)

    first, second, cut, later = turns
    for whole in (first, second, later):
        assert (whole.tokens, whole.estimated) == (max_tokens, False), whole
        assert expected_text(max_tokens) in whole.text and "cut at the token limit" in whole.rest
    assert "interrupted" in cut.rest and cut.estimated and 0 < cut.tokens < max_tokens, cut
    assert f"tok{max_tokens - 1}" not in cut.text
    assert after_cut == "", f"the reply went on after Ctrl-C: {after_cut!r}"
    assert status == 0



def test_in_process_a_model_that_cannot_load_is_one_error_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL_LOAD", "bad magic")
    chat = LocalChat(make_config(tmp_path, {"a": {}}), "a", worker_command=WORKER_COMMAND)
    try:
        with pytest.raises(ChatError, match="bad magic"):
            _within(30, chat.start)  # one try: start_retries = 1, no backoff to sit through
    finally:
        chat.close()


@contextmanager
def _stream_server(stream: bytes) -> Iterator[str]:
    """A "server" that knows every model and answers every POST with `stream`; yields
    its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._send(b'{"id": "m"}', "application/json")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self._send(stream, "text/event-stream")

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(
    ("stream", "says"),
    [
        (b"data: not json\n\n", "not JSON"),
        (b"data: [1, 2]\n\n", "not a chunk"),
        (b'data: {"choices": [{"delta": {"content": "half"}}]}\n\n', "without [DONE]"),
        (b'data: {"error": {"message": "worker crashed"}}\n\n', "worker crashed"),
    ],
)
def test_over_url_a_broken_or_hostile_stream_is_an_error_not_a_traceback(stream: bytes, says: str) -> None:
    with _stream_server(stream) as url:
        chat = HttpChat(url, None)
        assert chat.check("m") == "m"
        with pytest.raises(ChatError, match=re.escape(says)):
            _within(10, lambda: _text(chat.reply(_body(5))))


def test_over_url_odd_pieces_of_a_chunk_are_skipped_and_reasoning_kept_apart() -> None:
    stream = (
        b'data: {"choices": "x"}\n\n'
        b'data: {"choices": [7, {"delta": null}, {"delta": {"reasoning_content": "hm", "content": 3}}]}\n\n'
        b'data: {"choices": [{"delta": {"content": "yes"}, "finish_reason": "stop"}]}\n\n'
        b'data: {"choices": [], "usage": {"completion_tokens": 4}}\n\n'
        b"data: [DONE]\n\n"
    )
    with _stream_server(stream) as url:
        events = _within(10, lambda: list(HttpChat(url + "/v1/", None).reply(_body(5))))
    assert events == [Piece("hm", reasoning=True), Piece("yes"), Finished("stop", 4)]


def test_in_process_without_max_tokens_the_models_configured_default_applies(tmp_path: Path) -> None:
    chat = LocalChat(make_config(tmp_path, {"a": {"max_tokens": 4}}), "a", worker_command=WORKER_COMMAND)
    try:
        _within(30, chat.start)
        body = request_body("a", [{"role": "user", "content": "hi"}], ReplyOptions())
        assert "max_tokens" not in body
        assert _within(30, lambda: _text(chat.reply(body))) == (expected_text(4), Finished("length", 4))
    finally:
        chat.close()


def _long_body(model: str) -> dict[str, Any]:
    return request_body(model, [{"role": "user", "content": "word " * 40}], ReplyOptions(max_tokens=2))


def test_in_process_a_conversation_too_long_for_the_context_says_how_to_go_on(tmp_path: Path) -> None:
    chat = LocalChat(make_config(tmp_path, {"a": {"n_ctx": 16}}), "a", worker_command=WORKER_COMMAND)
    try:
        _within(30, chat.start)
        with pytest.raises(ChatError, match=r"/reset forgets the conversation\)$"):
            _within(30, lambda: _text(chat.reply(_long_body("a"))))
    finally:
        chat.close()


async def test_over_url_a_conversation_too_long_for_the_context_says_how_to_go_on(tmp_path: Path) -> None:
    sup = Supervisor(make_config(tmp_path, {"a": {"n_ctx": 16}}), worker_command=WORKER_COMMAND)
    with trio.fail_after(60):
        async with serving_http(sup) as url:

            def ask() -> str:
                with pytest.raises(ChatError) as caught:
                    _text(HttpChat(url, None).reply(_long_body("a")))
                return str(caught.value)

            said = await trio.to_thread.run_sync(ask)
    assert "context" in said and said.endswith("(/reset forgets the conversation)")
