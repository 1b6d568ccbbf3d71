"""Loopback port forwarding into a network namespace.

``LoopbackPortForwarder.start(netns_path, ports)`` brings up ``lo`` in the namespace at ``netns_path`` (a
``/proc/<pid>/ns/net`` path) and listens there on ``127.0.0.1:<port>`` (and ``[::1]:<port>`` where the
namespace has IPv6) for each port; every connection accepted there is relayed to ``127.0.0.1:<port>`` of
the caller's own network namespace. Nothing else crosses: the namespace keeps only its loopback device.

The listening sockets are created by a short-lived thread that enters the namespace (``setns``), so the
relay runs on the caller's event loop with no process inside the namespace. Needs ``CAP_SYS_ADMIN`` and
``CAP_NET_ADMIN`` over the namespace (root on the host).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Sequence

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_RELAY_CHUNK = 1 << 16


class LoopbackPortForwarder:
    """Relays ``127.0.0.1:<port>`` inside one network namespace to ``127.0.0.1:<port>`` outside it."""

    def __init__(self, servers: list[asyncio.Server], ports: tuple[int, ...]) -> None:
        self._servers = servers
        self._tasks: set[asyncio.Task] = set()
        self.ports = ports

    @classmethod
    async def start(cls, netns_path: str, ports: Sequence[int]) -> LoopbackPortForwarder:
        """Bring up ``lo`` in the namespace and listen there on each port (``ValueError`` on a bad port)."""
        ports = tuple(dict.fromkeys(int(port) for port in ports))
        for port in ports:
            if not 0 < port < 65536:
                raise ValueError(f"allowed port {port} is not a TCP port (1..65535)")
        sockets = await _in_netns(netns_path, lambda: _listen_on_loopback(ports))
        forwarder = cls([], ports)
        try:
            for port, sock in sockets:
                server = await asyncio.start_server(
                    lambda reader, writer, port=port: forwarder._relay(reader, writer, port), sock=sock
                )
                forwarder._servers.append(server)
        except BaseException:
            for _, sock in sockets:
                sock.close()
            await forwarder.close()
            raise
        return forwarder

    async def close(self) -> None:
        """Stop listening and cut every relayed connection."""
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        self._servers.clear()

    async def _relay(self, inside_reader: asyncio.StreamReader, inside_writer: asyncio.StreamWriter, port: int) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        outside_writer: asyncio.StreamWriter | None = None
        try:
            outside_reader, outside_writer = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.gather(_pump(inside_reader, outside_writer), _pump(outside_reader, inside_writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            for writer in (inside_writer, outside_writer):
                if writer is not None:
                    writer.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close ``writer`` so the far side sees the end of the request."""
    try:
        while data := await reader.read(_RELAY_CHUNK):
            writer.write(data)
            await writer.drain()
    finally:
        if writer.can_write_eof() and not writer.is_closing():
            with contextlib.suppress(OSError):
                writer.write_eof()


def _listen_on_loopback(ports: tuple[int, ...]) -> list[tuple[int, socket.socket]]:
    """In the current thread's namespace: ``lo`` up, then a listening socket per port and address family."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(control, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(control, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))
    sockets: list[tuple[int, socket.socket]] = []
    try:
        for port in ports:
            sockets.append((port, _listening_socket(socket.AF_INET, "127.0.0.1", port)))
            if socket.has_ipv6:
                with contextlib.suppress(OSError):  # a namespace without IPv6 keeps only the IPv4 listener
                    sockets.append((port, _listening_socket(socket.AF_INET6, "::1", port)))
    except BaseException:
        for _, sock in sockets:
            sock.close()
        raise
    return sockets


def _listening_socket(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _in_netns(netns_path: str, work):
    """Run ``work()`` on a fresh thread that has entered ``netns_path``; the thread ends with it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def run() -> None:
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.setns(fd, os.CLONE_NEWNET)
            finally:
                os.close(fd)
            result = work()
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=run, name="netns-listen", daemon=True).start()
    return await future


def _settle(future: asyncio.Future, result, exc: BaseException | None) -> None:
    if future.cancelled():
        if result is not None:
            for _, sock in result:
                sock.close()
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
