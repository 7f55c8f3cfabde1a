"""A model's engine process: the one place its requests are batched and run, whatever HTTP worker received them.

With several HTTP workers (`--http-workers N`, see `cluster.py`), each model gets one engine process
(`python -m tvmrnn.serve.engine SOCKET MODULE.so CONFIG`): it loads the module (a worker process of its own where
the model has index inputs, as `workers.make_runner` decides), keeps the streaming state of its sequences, and
batches the requests of every HTTP worker together; a batch runs in the batcher's worker thread (the module releases
the GIL), so the event loop goes on taking in requests and sending answers meanwhile, and the next batch, of what
queued during this one, starts as soon as this one ends.
HTTP workers reach it through `RemoteCore` over a Unix socket.

The socket carries `frames` (a binary head and the tensors' raw bytes; never pickled, no JSON). A request's head carries
its id, sequence parameters and whether its HTTP worker checked it already; an error's its id, HTTP status and message.
A batch's answers to one HTTP worker are one frame: their ids, and each output's rows of those requests gathered back
to back (`BatchOutputs.gather`: one copy per output and HTTP worker, not one per request), which the HTTP worker cuts
into each request's views. Both ends are asyncio protocols (`frames.FrameProtocol`): the frames that arrive together are
handled together and those sent in one turn of the event loop leave in one write, so a batch's answers to one HTTP
worker cost one write and one wake-up of that worker, not one per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import os
import signal
import sys
import threading

import numpy as np

from .batcher import Rows
from .frames import (ANSWERS, FrameProtocol, decode_answers, decode_error, decode_request, encode_answers, encode_error,
                     encode_request, request_id_of)
from .protocol import ProtocolError

log = logging.getLogger("tvmrnn.serve")
_CONNECT_TIMEOUT_S = 300.0
_SWITCH_INTERVAL_S = 0.0002


# -- the HTTP worker's side -----------------------------------------------------------------------------
class _EngineLink(FrameProtocol):
    def __init__(self, core: "RemoteCore"):
        super().__init__()
        self.core = core

    def on_frame(self, head: memoryview, data: memoryview) -> None:
        self.core.answered(head, data)

    def connection_lost(self, exc) -> None:
        self.core.lost(self)


class RemoteCore:
    """`ModelCore.infer` answered by the model's engine. Stateless requests are checked here (their 400s cost the engine
    nothing); a sequence's requests are checked by the engine, which holds their state. If the engine stops, the requests
    in flight get 503 and the connection is made again once the engine is back (the supervisor restarts it)."""

    def __init__(self, name: str, sig, socket_path: str):
        self.name, self.sig, self.socket_path = name, sig, socket_path
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self._link: _EngineLink | None = None
        self._reconnect: asyncio.Task | None = None
        self._closing = False

    async def connect(self, timeout_s: float = _CONNECT_TIMEOUT_S) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                _, self._link = await loop.create_unix_connection(lambda: _EngineLink(self), self.socket_path)
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if loop.time() > deadline:
                    raise RuntimeError(f"model {self.name!r}: its engine did not answer at {self.socket_path}") from None
                await asyncio.sleep(0.05)

    async def infer(self, feeds: dict[str, np.ndarray], datatypes: dict[str, str], sid=None, start: bool = False,
                    end: bool = False, checked: bool = False) -> dict[str, np.ndarray]:
        if sid is None and not checked:
            self.sig.check(feeds, datatypes)
            checked = True
        if self._link is None:
            raise ProtocolError(f"model {self.name!r} is restarting; retry", 503)
        request_id = next(self._ids)
        future = self._pending[request_id] = self._link.loop.create_future()
        self._link.send(encode_request(request_id, feeds, sid, start, end, checked))  # datatypes: the arrays' dtypes say them
        try:
            return await future
        finally:
            self._pending.pop(request_id, None)

    def answered(self, head: memoryview, data: memoryview) -> None:
        if head[0] != ANSWERS:
            request_id, status, message = decode_error(head)
            future = self._pending.get(request_id)
            if future is not None and not future.done():
                future.set_exception(ProtocolError(message, status))
            return
        ids, rows, lengths, outputs = decode_answers(head, data)
        start = 0
        for request_id, n, length in zip(ids, rows, lengths):
            future = self._pending.get(request_id)
            if future is not None and not future.done():  # else the client went away
                future.set_result(outputs if len(ids) == 1 else self.sig.take_rows(outputs, start, n, length))
            start += n

    def lost(self, link: _EngineLink) -> None:
        if link is not self._link:
            return
        self._link = None
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ProtocolError(f"model {self.name!r} stopped while running this request (it restarts); retry", 503))
        if not self._closing:
            log.warning("engine connection lost", extra={"fields": {"model": self.name}})
            self._reconnect = asyncio.get_running_loop().create_task(self.connect())

    async def close(self) -> None:
        self._closing = True
        if self._link is not None:
            self._link.transport.close()
        if self._reconnect is not None:
            self._reconnect.cancel()


# -- the engine's side -----------------------------------------------------------------------------------
class _EngineConnection(FrameProtocol):
    """One HTTP worker's connection: a checked stateless request goes straight into the batch queue, its answer sent
    from the batch's end (no task per request) with the other answers of its batch to this worker, in one frame; a
    sequence's request runs as a task (it waits for its sequence)."""

    def __init__(self, core, tasks: set):
        super().__init__()
        self.core, self.tasks = core, tasks
        self._rows: list[tuple[int, Rows]] = []  # answers of this turn of the loop, framed by batch at its end

    def on_frame(self, head: memoryview, data: memoryview) -> None:
        request_id = None
        try:
            request_id, sid, start, end, checked, feeds = decode_request(head, data)
            if sid is None and checked:
                self.core.enqueue(feeds, functools.partial(self._answer, request_id))
                return
        except Exception as err:  # noqa: BLE001 - answered (ProtocolError: its status, else 500); the engine goes on
            self._answer(request_id_of(head) if request_id is None else request_id, err)
            return
        task = self.loop.create_task(self._infer(request_id, feeds, sid, start, end, checked))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _infer(self, request_id: int, feeds: dict, sid, start: bool, end: bool, checked: bool) -> None:
        try:
            result = await self.core.infer(feeds, None, sid, start, end, checked)
        except Exception as err:  # noqa: BLE001 - answered below
            result = err
        self._answer(request_id, result)

    def _answer(self, request_id: int, result) -> None:
        if isinstance(result, Rows):
            self.wake()
            self._rows.append((request_id, result))
        elif isinstance(result, ProtocolError):
            self.send(encode_error(request_id, result.status, str(result)))
        elif isinstance(result, BaseException):
            log.error("infer failed", exc_info=result, extra={"fields": {"model": self.core.name}})
            self.send(encode_error(request_id, 500, f"internal error: {type(result).__name__}: {result}"))
        else:
            self.send(encode_answers([request_id], [0], [-1], result))

    def encode_pending(self) -> None:
        """A frame per batch among this turn's answers: its requests' rows gathered (one request: its own arrays)."""
        answers, self._rows = self._rows, []
        by_batch: dict[int, list[tuple[int, Rows]]] = {}
        for request_id, rows in answers:
            by_batch.setdefault(id(rows.batch), []).append((request_id, rows))
        for group in by_batch.values():
            if len(group) == 1:
                request_id, rows = group[0]
                self._out.append(encode_answers([request_id], [0], [-1], rows.arrays()))
                continue
            batch = group[0][1].batch
            n_rows, lengths, outputs = batch.gather([rows.index for _, rows in group])
            self._out.append(encode_answers([request_id for request_id, _ in group], n_rows, lengths, outputs))


async def run_engine(served, config, socket_path: str) -> None:
    """Serve one model (a `repository.ServedModel`) on a Unix socket until stdin closes (the supervisor stops its engines
    after its HTTP workers, so they ignore SIGTERM and SIGINT, which a service manager may send the whole group);
    print "ready" once listening."""
    from .batcher import Batcher
    from .core import ModelCore
    from .metrics import Metrics
    from .sequences import SequenceStore

    metrics = Metrics()
    sig = served.signature
    batcher = Batcher(sig, served.runner, sig.batch_limit(config.max_batch_size), config.max_delay_ms / 1000, metrics, split=False)
    batcher.start()
    sequences = SequenceStore(config.max_sequences, config.sequence_idle_s, metrics)
    core = ModelCore(served.name, sig, batcher, sequences)
    loop = asyncio.get_running_loop()
    sweeper = loop.create_task(sequences.sweep_forever())
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    tasks: set[asyncio.Task] = set()
    server = await loop.create_unix_server(lambda: _EngineConnection(core, tasks), socket_path)
    stop = asyncio.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
    print("ready", flush=True)
    await stop.wait()
    server.close()
    sweeper.cancel()
    await batcher.close()
    await asyncio.to_thread(served.runner.close)


def config_to_json(config) -> str:
    return json.dumps(dataclasses.asdict(config))


def config_from_json(text: str):
    from .config import ServeConfig

    fields = json.loads(text)
    fields["state"] = {m: [tuple(p) for p in pairs] for m, pairs in fields["state"].items()}
    return ServeConfig(**fields)


def main(socket_path: str, module_path: str, config_json: str, log_level: str) -> None:
    import logging.config

    from ..errors import InputError, UnsupportedModelError
    from .logs import logging_config
    from .repository import load_models
    from .workers import settle_heap

    for sig in (signal.SIGINT, signal.SIGTERM):  # sent to the whole group: the supervisor stops engines last
        signal.signal(sig, signal.SIG_IGN)
    logging.config.dictConfig(logging_config(log_level))
    config = config_from_json(config_json)
    try:
        (served,) = load_models([module_path], config).values()
    except (InputError, UnsupportedModelError) as err:  # one line, which the supervisor points at
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    settle_heap()
    # the batch thread waits for the GIL when its run returns: at most this long while the event loop is busy (5 ms by default)
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    try:
        import uvloop

        uvloop.run(run_engine(served, config, socket_path))
    except ImportError:
        asyncio.run(run_engine(served, config, socket_path))


if __name__ == "__main__":  # python -m tvmrnn.serve.engine SOCKET MODULE.so CONFIG_JSON LOG_LEVEL (stops when stdin closes)
    main(*sys.argv[1:5])
