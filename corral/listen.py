"""The listening sockets, bound before anything else starts.

`corral serve` binds every address itself, before the supervisor spawns a worker or the app
is built, and hands the bound sockets to hypercorn as `fd://` binds. A port someone else holds
is then one line naming the address and how to choose another, not hypercorn's bind failing
deep inside two nurseries (about sixty lines of ExceptionGroup, after workers had started).
"""

from __future__ import annotations

import errno
import socket


class CannotListen(Exception):
    """An address could not be bound; str() is the one line to show."""


def bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_WHY = {
    errno.EADDRINUSE: "the port is already in use (another server, or an earlier corral, is listening there)",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address",
}


def open_listeners(hosts: list[str], port: int) -> list[int]:
    """Bind and listen on `port` at every host, as hypercorn would (SO_REUSEADDR,
    TCP_NODELAY), and give their descriptors; on the first failure close what was bound
    and raise CannotListen."""
    bound: list[socket.socket] = []
    try:
        for host in hosts:
            address = bind_address(host, port)
            try:
                bound.append(_bind(host, port))
            except OSError as exc:
                why = _WHY.get(exc.errno or 0) or exc.strerror or str(exc)
                raise CannotListen(f"cannot listen on {address}: {why}") from exc
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return [sock.detach() for sock in bound]


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(sockaddr)
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
