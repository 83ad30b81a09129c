"""`corral chat MODEL`: talk to a model in the terminal.

  corral chat MODEL --url URL          a running server ($CORRAL_URL); the API key from
                                       $CORRAL_API_KEY or --api-key-file, never an argument
  corral chat MODEL [--config FILE]    in this process: the supervisor loads just MODEL

The conversation and what a typed line means are in corral/chat/session.py; the two ways
of getting a reply in corral/chat/over_http.py and corral/chat/in_process.py. This module is the
terminal: prompts, streamed text, Ctrl-C, the figures after each reply.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import threading
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator, Protocol, TextIO

from corral.chat.in_process import LocalChat
from corral.chat.over_http import HttpChat
from corral.chat.session import (
    HELP,
    ChatError,
    Conversation,
    Event,
    Exit,
    Finished,
    Help,
    LineReader,
    Problem,
    ReplyOptions,
    ReplyTimes,
    Reset,
    Say,
    SetSystem,
    printable,
    request_body,
    stats_line,
)
from corral.args import add_config_option, config_path, print_problems
from supervisor.config import ConfigError, load
from worker import log_format

if TYPE_CHECKING:
    from corral.args import Subparsers

URL_ENV = "CORRAL_URL"
KEY_ENV = "CORRAL_API_KEY"
PROMPT, MORE = "> ", "... "
MAX_TOKENS = 2**31 - 1  # the request's max_tokens is an int32


class Backend(Protocol):
    def reply(self, body: dict[str, Any]) -> Generator[Event, None, None]: ...


def add(sub: Subparsers) -> None:
    c = sub.add_parser(
        "chat",
        # `--api-key KEY` must not be read as an abbreviation of --api-key-file, whose
        # error would then print the key as a file name.
        allow_abbrev=False,
        help="chat with a model in the terminal",
        description=(
            "Chat with MODEL: over HTTP with --url (or $CORRAL_URL), else in this process, "
            "loading just MODEL from the config file. Type /help in the chat for its commands."
        ),
    )
    c.add_argument("model", metavar="MODEL", help="a model name or alias")
    c.add_argument("--url", help=f"a running Corral (or OpenAI-compatible) server; default ${URL_ENV}")
    c.add_argument(
        "--api-key-file", metavar="FILE",
        help=f"a file holding the server's API key (else ${KEY_ENV}); keys are never arguments, "
        "which any user could read in the process list",
    )
    # Taken only to be refused without echoing its value (argparse's own "unrecognized
    # arguments" error would print the key).
    c.add_argument("--api-key", dest="api_key_argument", nargs="?", const="", help=argparse.SUPPRESS)
    add_config_option(c)
    c.add_argument("--system", default="", metavar="TEXT", help="the system message")
    c.add_argument("--max-tokens", type=int, metavar="N", help="a reply's token limit (default: the model's configured one)")
    c.add_argument("--temperature", type=float, metavar="T", help="0 (greedy) to 2 (default: the server's, 0.8)")
    c.set_defaults(run=run)


def options(args: argparse.Namespace) -> ReplyOptions:
    """The sampling options, checked here so that a bad one fails before any load."""
    if args.max_tokens is not None and not 1 <= args.max_tokens <= MAX_TOKENS:
        raise ChatError(f"--max-tokens: must be from 1 to {MAX_TOKENS}, got {args.max_tokens}")
    t = args.temperature
    if t is not None and not (math.isfinite(t) and 0.0 <= t <= 2.0):
        raise ChatError(f"--temperature: must be from 0 to 2, got {t}")
    return ReplyOptions(max_tokens=args.max_tokens, temperature=t)


def api_key(file: str | None) -> str | None:
    """The key from --api-key-file (its first line that is not blank or a # comment), else
    from $CORRAL_API_KEY, else None."""
    if file is None:
        return os.environ.get(KEY_ENV) or None
    try:
        text = Path(file).read_text(encoding="utf-8")
    except OSError as exc:  # the path is not repeated: it might be a key given by mistake
        raise ChatError(f"--api-key-file: cannot read the file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ChatError("--api-key-file: the file is not UTF-8 text") from None
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    raise ChatError(f"--api-key-file: {file} holds no key")


def run(args: argparse.Namespace) -> int:
    # Ctrl-C is how a reply is stopped. A process started with SIGINT ignored (a
    # background job of a shell without job control, some CI runners) inherits that, and
    # Python then installs no KeyboardInterrupt: take it back explicitly (signals reach
    # the main thread only; a test may call this from another).
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    local: LocalChat | None = None
    try:
        if args.api_key_argument is not None:
            raise ChatError(
                "--api-key: a key is never a command-line argument (any user can read those in "
                f"the process list); set ${KEY_ENV} or use --api-key-file FILE"
            )
        opts = options(args)
        url = args.url
        if url is not None and args.config is not None:
            raise ChatError("give --url (a running server) or --config (in this process), not both")
        from_env = url is None and args.config is None and bool(os.environ.get(URL_ENV))
        if from_env:
            url = os.environ[URL_ENV]
        backend: Backend
        if url is not None:
            http = HttpChat(url, api_key(args.api_key_file))  # checks the URL first
            if from_env:
                print(f"corral: chatting over {url} (${URL_ENV})", file=sys.stderr)
            model = http.check(args.model)
            backend, where = http, url
        else:
            if args.api_key_file is not None:
                raise ChatError("--api-key-file is for --url: an in-process chat needs no key")
            path = config_path(args.config)
            cfg = load(path)
            # Only warnings and errors, the workers' too: the chat's own output is the
            # terminal's (a worker's INFO line on exit landed under the last prompt).
            log_format.configure(logging.WARNING, "text")
            log_format.hand_down(logging.WARNING, "text")
            local = LocalChat(cfg, args.model)
            model, where = args.model, f"in this process, from {path}"
            print(f"loading {model}...", file=sys.stderr, flush=True)
            local.start()
            backend = local
        print(f"chatting with {printable(model)} ({where}); /help for commands, /exit or Ctrl-D to leave", file=sys.stderr)
        return Terminal(backend, model, opts, Conversation(system=args.system)).loop()
    except ConfigError as exc:
        print_problems(exc)
        return 1
    except ChatError as exc:
        print(f"corral chat: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # during the load: nothing to keep
        print(file=sys.stderr)
        return 130
    finally:
        if local is not None:
            local.close()


class Terminal:
    """The prompt loop over one backend."""

    def __init__(self, backend: Backend, model: str, opts: ReplyOptions, conversation: Conversation,
                 out: TextIO | None = None) -> None:
        self.backend, self.model, self.opts, self.conversation = backend, model, opts, conversation
        self.out = out if out is not None else sys.stdout
        self.reader = LineReader()
        self.dim = self.out.isatty()
        if sys.stdin.isatty():
            import readline  # noqa: F401  (line editing and history for input())

    def _faint(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.dim else text

    def loop(self) -> int:
        while True:
            try:
                line = input(MORE if self.reader.in_block else PROMPT)
            except EOFError:
                print(file=self.out)
                return 0
            except KeyboardInterrupt:
                self.reader.drop()
                print(f"\n{self._faint('(Ctrl-C drops the line; /exit or Ctrl-D leaves)')}", file=self.out)
                continue
            cmd = self.reader.feed(line)
            if cmd is None:
                continue
            if isinstance(cmd, Exit):
                return 0
            if isinstance(cmd, Help):
                print(HELP, file=self.out)
            elif isinstance(cmd, Problem):
                print(cmd.message, file=self.out)
            elif isinstance(cmd, Reset):
                self.conversation.reset()
                print(self._faint("(conversation forgotten)"), file=self.out)
            elif isinstance(cmd, SetSystem):
                self.conversation.system = cmd.text
                print(self._faint("(system message set)" if cmd.text else "(system message cleared)"), file=self.out)
            elif isinstance(cmd, Say):
                self.say(cmd.text)

    def say(self, text: str) -> None:
        """One exchange: stream the reply, then its figures. Ctrl-C stops the reply and
        keeps what came (a reply with nothing in it drops the exchange, so that two user
        messages never follow each other)."""
        body = request_body(self.model, self.conversation.messages(text), self.opts)
        asked = time.monotonic()
        first: float | None = None
        last: float | None = None
        pieces = 0
        reply: list[str] = []
        finished: Finished | None = None
        interrupted = False
        events = self.backend.reply(body)
        try:
            for ev in events:
                if isinstance(ev, Finished):
                    finished = ev
                    continue
                last = time.monotonic()
                first = first if first is not None else last
                pieces += 1
                shown = printable(ev.text)
                if ev.reasoning:
                    self.out.write(self._faint(shown))
                else:
                    reply.append(ev.text)
                    self.out.write(shown)
                self.out.flush()
        except KeyboardInterrupt:
            interrupted = True
        except ChatError as exc:
            print(f"\nerror: {printable(str(exc))}", file=self.out)
            return
        finally:
            events_close(events)
        whole = "".join(reply)
        if whole.strip():
            self.conversation.add(text, whole)
        tokens = finished.tokens if finished is not None else None
        line = stats_line(ReplyTimes(asked, first, last), tokens, pieces, interrupted)
        if finished is not None and finished.finish_reason == "length":
            line += ", cut at the token limit"
        print(f"\n{self._faint('[' + line + ']')}", file=self.out, flush=True)


def events_close(events: Generator[Event, None, None]) -> None:
    """Close a reply's generator, which stops the reply if it is still running; a second
    Ctrl-C while it closes is taken as the same one."""
    try:
        events.close()
    except KeyboardInterrupt:
        events.close()
