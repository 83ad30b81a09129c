"""Health watching: ping a worker, and kill it when it stops answering."""

from __future__ import annotations

import logging
import math
from typing import Callable

import trio

from supervisor.connection import WorkerConnection
from supervisor.errors import WorkerCrashed
from worker.protocol import Ping

log = logging.getLogger("corral.supervisor")


async def watch(
    conn: WorkerConnection,
    name: str,
    interval: float,
    misses: int,
    on_ping: Callable[[], None],
    on_hung: Callable[[], None],
) -> None:
    """Ping every `interval` seconds; kill a worker that leaves `misses` pings in a row
    unanswered, each given half an interval to answer. Returns once the connection has
    closed (or at once with health checks off).

    The worker answers pings from its event loop, not its decode thread, so a long decode
    step does not count as a miss. The deadline runs from the last answer, which came at or
    before the hang, so a hang is noticed within (misses + 1/2) * interval. That leaves half
    an interval of the promised (misses + 1) * interval for the replacement, which the
    handle's run loop starts at once after the kill. `on_ping` runs before each ping (the
    handle measures the worker's memory then); `on_hung` runs just before the kill, so the
    handle knows why its worker died before the death reaches it.

    Silence is only the worker's while this event loop could listen. A loop that stalled
    (a request's work held it: found by the outside probe of issue 40, a 200 MB upstream
    answer decoded in one call held it 17 s) leaves every answer unread in the socket, and
    its stall would read as every worker's silence: all of them killed as hung, their
    requests broken, by one request that touched none of them. The watch sees such a stall
    as its own late wake-up, and counts silence from the stall's end, with a ping at once.
    """
    if interval <= 0:
        return
    allowed = interval * (misses + 0.5)
    next_ping = trio.current_time() + interval
    excused = -math.inf  # silence before this was the loop's own, not the worker's
    seq = 0
    while not conn.closed.is_set():
        wake = min(next_ping, max(conn.last_pong, excused) + allowed)
        await trio.sleep_until(wake)
        now = trio.current_time()
        if now - wake > interval / 2:  # this loop stalled: the worker may have answered
            log.warning("%s: the event loop stalled for %.1fs; its silence meanwhile is not counted", name, now - wake)
            excused, next_ping = now, now
        silent = now - max(conn.last_pong, excused)
        if silent >= allowed:
            pid = conn.process.pid if conn.process is not None else None
            log.warning("%s: no answer to pings for %.1fs; killing pid %s as hung", name, silent, pid)
            on_hung()
            conn.kill(f"worker hung: no answer to pings for {silent:.1f}s")
            return
        if trio.current_time() >= next_ping:
            next_ping += interval
            seq += 1
            on_ping()
            try:
                conn.send(Ping(seq=seq))
            except WorkerCrashed:
                return
