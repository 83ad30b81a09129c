"""A NOTIFY_SOCKET whose receiver stops reading never stalls the event loop (issue 40,
finding 7: a blocking sendto from the loop waited for a full receiver, and every request
with it); what could not be sent waits by its kind's rule and goes, in order, once the
receiver reads again."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import trio

from supervisor.systemd import Notifier


def full_receiver(path: Path) -> socket.socket:
    """A datagram socket bound at `path` whose queue is full: nothing more fits until it
    reads. Filled from throwaway senders until a fresh one cannot add a byte (the queue's
    length, ten datagrams by default, or its memory, whichever comes first)."""
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sink.bind(str(path))
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as filler:
            filler.setblocking(False)
            try:
                filler.sendto(b"filler", str(path))
            except BlockingIOError:
                return sink
            try:
                while True:
                    filler.sendto(b"filler", str(path))
            except BlockingIOError:
                pass


def read_all(sink: socket.socket) -> list[bytes]:
    out = []
    sink.setblocking(False)
    try:
        while True:
            out.append(sink.recv(4096))
    except BlockingIOError:
        return out


def test_a_receiver_that_never_reads_never_stalls_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    sink = full_receiver(path)
    notifier = Notifier({"NOTIFY_SOCKET": str(path)})
    ticks: list[float] = []

    async def main() -> None:
        async def tick() -> None:
            while True:
                ticks.append(trio.current_time())
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            notifier.notify("READY=1", "STATUS=0 of 1 models loaded")
            for i in range(30):
                notifier.notify("WATCHDOG=1", f"STATUS=tick {i}")
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    # A blocked sendto blocks the whole thread, where no trio timeout can reach it: the
    # loop runs in a thread of its own, and reading the receiver frees it if it is stuck.
    loop = threading.Thread(target=trio.run, args=(main,), daemon=True)
    loop.start()
    loop.join(timeout=5)
    stalled = loop.is_alive()
    try:
        assert not stalled, "the event loop stalled in sd_notify"
        assert len(ticks) >= 20  # the other task ran all along
        # The receiver reads again: what waited arrives, in order; the pings sent late
        # would say nothing true and were dropped, and only the latest status is worth sending.
        assert set(read_all(sink)) == {b"filler"}
        notifier.flush()
        assert read_all(sink) == [b"READY=1", b"STATUS=tick 29"]
    finally:
        while loop.is_alive():
            read_all(sink)
            loop.join(timeout=0.1)
        sink.close()
