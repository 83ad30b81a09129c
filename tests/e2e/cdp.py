"""Headless Chromium driven over the Chrome DevTools Protocol, for the dashboard's test.

Debian's `chromium` is the browser (no download: `make test` installs the package where it
is missing). The protocol runs over `--remote-debugging-pipe`: Chromium reads commands from
its fd 3 and writes answers to its fd 4, each a JSON message ended by a NUL byte. That needs
no port, no websocket library and no driver binary matched to the browser's version, which
selenium (chromium-driver) and playwright would each add.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

# OPS_NOTES: what a browser in a container, with no network and no display, needs.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
]


class BrowserError(Exception):
    pass


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        if (found := shutil.which(name)) is not None:
            return found
    raise BrowserError("no chromium on PATH: install Debian's chromium package (make system-packages)")


def _above(fd: int, lowest: int) -> int:
    """`fd` moved to a number of at least `lowest`."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)
    os.close(fd)
    return moved


class Chromium:
    """One browser with one page. Every call blocks until Chromium answers, or raises
    BrowserError after `timeout` seconds."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 960, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.problems: list[str] = []  # uncaught exceptions and console errors, as they come
        self._ids = iter(range(1, 1 << 62))
        self._replies: dict[int, dict[str, Any]] = {}
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's ends must not be fds 3 or 4 themselves (under pytest's capture they
        # can be), or the shell's redirections below would close one while placing the other.
        to_browser_r, from_browser_w = _above(to_browser_r, 10), _above(from_browser_w, 10)
        # The shell puts the two pipe ends on fds 3 and 4, where Chromium looks for them
        # (bash: dash's redirections take single-digit fds only).
        script = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-'
        self.process = subprocess.Popen(
            ["bash", "-c", script, chromium_binary(), *FLAGS, f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    # ---- transport ------------------------------------------------------------------------

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_browser, 1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for m in messages:
                self._inbox.put(json.loads(m))
        self._inbox.put(None)  # the browser closed its end

    def _note(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.problems.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.problems.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.problems.append(f"log ({params['entry'].get('source')}): {params['entry']['text']}")

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while msg_id not in self._replies:
            try:
                got = self._inbox.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise BrowserError(f"{method}: no answer in {self.timeout} s") from None
            if got is None:
                raise BrowserError(f"{method}: the browser exited ({self.process.poll()})")
            if "id" in got:
                self._replies[got["id"]] = got
            else:
                self._note(got)
        reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    # ---- the page -------------------------------------------------------------------------

    def navigate(self, url: str) -> None:
        result = self.call("Page.navigate", session=True, url=url)
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")
        # Page.navigate answers once the navigation has begun: wait for the new document.
        self.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
            self.timeout, f"{url} to load",
        )

    def add_init_script(self, source: str) -> None:
        """Run `source` in every document this page opens from now on, before its own scripts."""
        self.call("Page.addScriptToEvaluateOnNewDocument", session=True, source=source)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            d = result["exceptionDetails"]
            raise BrowserError(f"{expression!r}: {d.get('exception', {}).get('description', d.get('text'))}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """Poll the page until `expression` is truthy; its value. Polling the DOM, never a
        fixed sleep, keeps the test quick on a fast machine and patient on a slow one."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out after {timeout} s waiting for {what} ({expression})")
            time.sleep(0.1)

    def click(self, selector: str) -> None:
        """A real mouse click at the middle of the element, as a person's: it fails if
        the element is hidden, and reaches whatever covers it."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return r.width && r.height ? [r.x + r.width / 2, r.y + r.height / 2] : null; })()"
        )
        if box is None:
            raise BrowserError(f"nothing visible to click at {selector}")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left", clickCount=1)

    def type_into(self, selector: str, text: str) -> None:
        """Focus an input and type `text` into it as if from the keyboard."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", session=True, text=text)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except BrowserError:
            pass
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        self._reader.join(timeout=5)
        os.close(self._from_browser)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
