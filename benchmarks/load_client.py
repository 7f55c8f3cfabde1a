"""The load test's clients: keep-alive HTTP/1.1 connections as asyncio protocols, answers parsed by httptools.

A client process stands for clients on other machines, so it should cost the served host as little CPU as it can:
every request is encoded to its bytes (request line, headers, body) before the clock starts, a connection sends one
with a single write and parses its answer with httptools' callbacks (no task, coroutine or header dict per request),
and the answers are checked against the direct call's after the clock stops. One outstanding request per connection
(no pipelining), as an HTTP client library keeps it.

- closed loop (`rate` None): `clients` connections, each taking the next stream when it has answered the last one's
  final request, and a stream's next request when it has the previous one's answer;
- open loop (at `rate` req/s): request i of stream k is due at t0 + (k + i * len(streams)) / rate, and not before the
  previous request of its stream is answered; it leaves on an idle connection (a new one where all are busy, as a
  client library with no connection limit does). Its latency runs from when it was due; its send lag is how late it left.

A request whose connection the server closes fails (answer None), and in closed loop so does the rest of its stream, a
new connection taking the next stream; no answer at all for _STALL_S ends the run, what is unanswered failing.
"""

from __future__ import annotations

import asyncio
import collections
import time

import httptools

HEADER_LENGTH = b"inference-header-content-length"
_OPEN_LOOP_START_S = 0.1  # the open-loop schedule starts after every connection is open
_STALL_S = 60.0  # no answer for this long ends the run: what is unanswered counts as failed


def encode_post(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection: `send(wire, done)` writes a request; `done(status, header length, body)` is called
    with its answer, or `done(None, b"", b"")` if the connection fails."""

    def __init__(self, on_lost):
        self._parser = httptools.HttpResponseParser(self)
        self._on_lost = on_lost
        self._done = None
        self.transport = None
        self.usable = True  # connected, and the server keeps the connection open

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, wire: bytes, done) -> None:
        if not self.usable:
            asyncio.get_running_loop().call_soon(done, None, b"", b"")
            return
        self._done, self._header_length, self._body = done, b"0", []
        self.transport.write(wire)

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == HEADER_LENGTH:
            self._header_length = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        done, self._done = self._done, None
        self.usable = self._parser.should_keep_alive()
        if done is not None:
            done(self._parser.get_status_code(), self._header_length, b"".join(self._body))

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.usable = False
        done, self._done = self._done, None
        if done is not None:
            done(None, b"", b"")
        self._on_lost(self)


class LoadRun:
    """Sends `wires` (per stream, each request's bytes in order) to host:port; `answers[k][i]` is (status, header
    length, body) or None, `times` the latencies (s), `lags` the open loop's send lags (s)."""

    def __init__(self, host: str, port: int, wires: list[list[bytes]], clients: int, rate: float | None):
        self.host, self.port, self.wires, self.clients, self.rate = host, port, wires, clients, rate
        self.answers = [[None] * len(w) for w in wires]
        self.times: list[float] = []
        self.lags: list[float] = []
        self._idle: collections.deque[_Connection] = collections.deque()
        self._left = sum(len(w) for w in wires)
        self._finished: asyncio.Future | None = None
        self._answers_seen = 0

    async def run(self) -> tuple[float, float]:
        """(start, end) wall-clock times of the run."""
        self.loop = asyncio.get_running_loop()
        self._finished = self.loop.create_future()
        for _ in range(self.clients):
            self._idle.append(await self._open())
        if self._left == 0:
            return time.time(), time.time()
        if self.rate:
            self._t0, self._t0_clock = self.loop.time() + _OPEN_LOOP_START_S, time.perf_counter() + _OPEN_LOOP_START_S
            start = time.time() + _OPEN_LOOP_START_S
            for k in range(len(self.wires)):
                if self.wires[k]:
                    self.loop.call_at(self._t0 + self._offset(k, 0), self._due, k, 0)
        else:
            start = time.time()
            streams = iter(range(len(self.wires)))
            connections = list(self._idle)
            self._idle.clear()
            for conn in connections:
                self._next_stream(conn, streams)
        self._watch(-1)
        await self._finished
        end = time.time()
        for conn in self._idle:
            conn.transport.close()
        return start, end

    async def _open(self) -> _Connection:
        _, conn = await self.loop.create_connection(lambda: _Connection(self._lost), self.host, self.port)
        return conn

    def _lost(self, conn: _Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def _watch(self, seen: int) -> None:
        """End the run if no answer came since the last look, _STALL_S ago (a server that stopped answering)."""
        if self._finished.done():
            return
        if seen == self._answers_seen:
            self._finished.set_result(None)
            return
        self.loop.call_later(_STALL_S, self._watch, self._answers_seen)

    def _answered(self, k: int, i: int, sent: float, answer) -> None:
        self.times.append(time.perf_counter() - sent)
        self.answers[k][i] = answer if answer[0] is not None else None
        self._answers_seen += 1
        self._count_done(1)

    def _count_done(self, n: int) -> None:
        self._left -= n
        if self._left == 0 and not self._finished.done():
            self._finished.set_result(None)

    # -- closed loop: a connection sends its stream's requests one after another, then takes the next stream
    def _next_stream(self, conn: _Connection, streams) -> None:
        for k in streams:
            if self.wires[k]:
                self._send_closed(conn, streams, k, 0)
                return
        self._idle.append(conn)

    def _send_closed(self, conn: _Connection, streams, k: int, i: int) -> None:
        sent = time.perf_counter()

        def done(status, header_length, body):
            self._answered(k, i, sent, (status, header_length, body))
            if status is None:  # the connection is gone: the rest of its stream fails, a new one takes the next stream
                self._count_done(len(self.wires[k]) - i - 1)
                self.loop.create_task(self._replace(streams))
                return
            if i + 1 < len(self.wires[k]):
                self._send_closed(conn, streams, k, i + 1)
            else:
                self._next_stream(conn, streams)

        conn.send(self.wires[k][i], done)

    async def _replace(self, streams) -> None:
        try:
            conn = await self._open()
        except OSError:
            for k in streams:  # nothing left to send them on
                self._count_done(len(self.wires[k]))
            return
        self._next_stream(conn, streams)

    # -- open loop: each request at its time, on an idle connection
    def _offset(self, k: int, i: int) -> float:
        return (k + i * len(self.wires)) / self.rate

    def _due(self, k: int, i: int) -> None:
        due = self._t0_clock + self._offset(k, i)  # on perf_counter's clock: the loop's time may count whole ms
        if self._idle:
            self._send_open(self._idle.pop(), k, i, due)
        else:
            self.loop.create_task(self._send_on_new(k, i, due))

    async def _send_on_new(self, k: int, i: int, due: float) -> None:
        try:
            conn = await self._open()
        except OSError:
            self._answered(k, i, due, (None, b"", b""))
            return
        self._send_open(conn, k, i, due)

    def _send_open(self, conn: _Connection, k: int, i: int, due: float) -> None:
        now = time.perf_counter()
        self.lags.append(max(0.0, now - due))

        def done(status, header_length, body):
            self._answered(k, i, min(now, due), (status, header_length, body))
            if conn.usable:
                self._idle.append(conn)
            if i + 1 < len(self.wires[k]):
                self.loop.call_at(self._t0 + self._offset(k, i + 1), self._due, k, i + 1)  # at once where it has passed

        conn.send(self.wires[k][i], done)


def run_load(host: str, port: int, wires: list[list[bytes]], clients: int, rate: float | None):
    """Run the load on uvloop where it is installed: (LoadRun with its answers and times, start, end, CPU seconds
    this process spent on it)."""
    load = LoadRun(host, port, wires, clients, rate)

    async def main():
        cpu = time.process_time()
        start, end = await load.run()
        return start, end, time.process_time() - cpu

    try:
        import uvloop

        start, end, cpu = uvloop.run(main())
    except ImportError:
        start, end, cpu = asyncio.run(main())
    return load, start, end, cpu
