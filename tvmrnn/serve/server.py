"""Running the app under uvicorn: in the foreground (`tvmrnn serve`) or in a background thread (tests, load test).

uvicorn does the graceful shutdown: on SIGTERM/SIGINT it stops accepting connections, lets in-flight
requests finish (up to `graceful_timeout_s`), then runs the app's lifespan end (drain queues, stop workers).
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .logs import logging_config
from .workers import settle_heap


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening socket (port 0: a free one), so the caller knows the port before the server starts. reuse_port: more
    sockets may listen on the port (SO_REUSEPORT), and the kernel spreads the new connections over them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY only for proto TCP
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _CoalescedWrites:
    """A connection's transport whose writes of one turn of the event loop leave in one `writelines` (one system call):
    uvicorn writes a response's head and body separately, each at once, so every answer cost two sends (and the client
    two reads). Everything else is the transport's own; `close` sends what is held first."""

    def __init__(self, transport, loop):
        self._transport, self._loop, self._out = transport, loop, []

    def write(self, data) -> None:
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and not self._transport.is_closing():
            self._transport.writelines(out)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name):
        return getattr(self._transport, name)


class _HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, its writes coalesced per turn of the event loop (`_CoalescedWrites`)."""

    def connection_made(self, transport) -> None:
        super().connection_made(_CoalescedWrites(transport, self.loop))


def make_server(app, graceful_timeout_s: float = 30.0, log_level: str = "info") -> uvicorn.Server:
    # proxy_headers off: nothing reads the client's address, and its middleware ran on every request
    config = uvicorn.Config(app, http=_HttpProtocol, log_config=logging_config(log_level), access_log=False, lifespan="on", proxy_headers=False,
                            server_header=False,
                            timeout_graceful_shutdown=max(1, round(graceful_timeout_s)), log_level=log_level)
    return uvicorn.Server(config)


def serve_forever(app, sock: socket.socket, graceful_timeout_s: float = 30.0, log_level: str = "info") -> None:
    """Serve on a socket from `bind` until SIGTERM/SIGINT (the process's whole job: its start-up heap is settled first)."""
    settle_heap()
    make_server(app, graceful_timeout_s, log_level).run(sockets=[sock])


class ServerThread:
    """`with ServerThread(app) as srv: httpx.get(srv.url + "/v2/health/ready")` on a free loopback port."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning", graceful_timeout_s: float = 10.0):
        self._sock = bind(host, port)
        self.host, self.port = host, self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = make_server(app, graceful_timeout_s, log_level)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="uvicorn")

    def start(self, timeout_s: float = 60.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
