"""Dynamic batching: concurrent requests for one model run as one batch.

Requests queue per model. A batch starts from the oldest queued request and takes the queued requests
that can join it (equal group key: same shapes off the batch and padded axes, see `Signature.group_key`)
until it has `max_batch_size` rows or `max_delay_s` has passed since that oldest request arrived; a request that
arrived while the model ran the batch before waits for nothing more: under load batches run back to back, each taking
what queued during the last, and the model is never idle while requests wait.
One batch runs at a time per model, merged, run and split back in the model's own worker thread, so the event loop goes
on reading and answering requests while it runs (the module releases the GIL; `split=False`: `enqueue`'s callbacks get
each request's `Rows` unsplit, which an engine gathers per HTTP worker). A runner with `buckets` (a module on the GPU)
gets its batches padded to a bucket and assembled into its own buffers (`runner.buffer`), so its shapes repeat.

When a batch crashes the model's worker process (see `workers.py`) or fails the runtime's input checks,
its requests are re-run one by one so only the request at fault fails.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from ..errors import InputError
from .metrics import Metrics, observe_many
from .protocol import ProtocolError
from .signature import BatchOutputs, Signature
from .workers import WorkerCrashed

log = logging.getLogger("tvmrnn.serve")


class ShuttingDown(ProtocolError):
    def __init__(self, model: str):
        super().__init__(f"model {model!r} is shutting down", 503)


class Rows:
    """Request `index`'s outputs in a run batch (`BatchOutputs`): what `enqueue`'s callback gets, so an engine can answer
    a batch's requests from one HTTP worker with one gathered copy; `arrays()` are the request's own."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: BatchOutputs, index: int):
        self.batch, self.index = batch, index

    def arrays(self) -> dict[str, np.ndarray]:
        return self.batch.request(self.index)


class _Item:
    """One queued request; answered through `future` (awaited by `submit`: its outputs) or `deliver` (called with its
    `Rows` or the exception to raise for it: `enqueue`, an engine's connection)."""

    __slots__ = ("feeds", "rows", "key", "enqueued", "future", "deliver")

    def __init__(self, feeds, rows: int, key, future: asyncio.Future | None, deliver: Callable | None):
        self.feeds, self.rows, self.key, self.future, self.deliver = feeds, rows, key, future, deliver
        self.enqueued = time.perf_counter()

    def gone(self) -> bool:
        """Its client went away (the awaiting task was cancelled)."""
        return self.future is not None and self.future.done()

    def resolve(self, result) -> None:
        if self.future is None:
            self.deliver(result)
        elif not self.future.done():
            if isinstance(result, BaseException):
                self.future.set_exception(result)
            else:
                self.future.set_result(result.arrays() if isinstance(result, Rows) else result)


class Batcher:
    def __init__(self, sig: Signature, runner, max_batch_size: int, max_delay_s: float, metrics: Metrics, split: bool = True):
        self.sig, self.runner, self.metrics, self.split = sig, runner, metrics, split
        self.max_batch_size, self.max_delay_s = max_batch_size, max_delay_s
        self._pending: collections.deque[_Item] = collections.deque()
        self._rows: dict[object, int] = {}  # group key -> rows queued under it
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"tvmrnn-{sig.name}")
        self._queue_seconds = metrics.queue_seconds.labels(sig.name)
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._last_end = float("-inf")  # when the last batch's run ended

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.sig.name}")

    async def submit(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Queue one checked request; its outputs (all of the model's) when its batch has run."""
        future = asyncio.get_running_loop().create_future()
        self._queue(_Item(feeds, self.sig.rows(feeds), self.sig.group_key(feeds), future, None))
        return await future

    def enqueue(self, feeds: dict[str, np.ndarray], deliver: Callable) -> None:
        """Queue one checked request without a task waiting on it: `deliver(outputs or exception)` once its batch has run."""
        self._queue(_Item(feeds, self.sig.rows(feeds), self.sig.group_key(feeds), None, deliver))

    def _queue(self, item: _Item) -> None:
        if self._closing or self._task is None:
            raise ShuttingDown(self.sig.name)
        self._pending.append(item)
        rows = self._rows[item.key] = self._rows.get(item.key, 0) + item.rows
        if len(self._pending) == 1 or rows >= self.max_batch_size:  # the loop waits for a first request or a full batch
            self._wakeup.set()

    async def close(self) -> None:
        """Finish every queued request, then stop the worker thread."""
        self._closing = True
        if self._task is not None:
            self._wakeup.set()
            await self._task
        self._executor.shutdown(wait=True)

    def bucket(self, rows: int) -> int:
        """The rows a batch of `rows` is padded to: the next power of two, at most max_batch_size (the module's bound)."""
        return min(1 << max(rows - 1, 0).bit_length(), max(self.max_batch_size, rows))

    # -- the loop ---------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            while self._pending and self._pending[0].gone():
                self._forget(self._pending.popleft())
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            head = self._pending[0]
            if self.sig.batchable:
                await self._fill(head)
            batch = self._take(head.key)
            if not batch:  # every request of it went away meanwhile
                continue
            try:
                await self._run(batch)
            except Exception as err:  # noqa: BLE001 - never let one batch end the loop
                log.exception("batch failed", extra={"fields": {"model": self.sig.name}})
                for it in batch:
                    it.resolve(err)

    async def _fill(self, head: _Item) -> None:
        """Wait until `head`'s batch has max_batch_size rows, max_delay_s has passed since `head` arrived, or the batcher
        closes; not at all where `head` arrived while the last batch ran. One timer per batch; a new request wakes the
        loop only when it fills the batch."""
        if head.enqueued <= self._last_end:
            return
        passed = False

        def deadline() -> None:
            nonlocal passed
            passed = True
            self._wakeup.set()

        timer = asyncio.get_running_loop().call_later(max(0.0, head.enqueued + self.max_delay_s - time.perf_counter()), deadline)
        try:
            while not passed and not self._closing and self._rows.get(head.key, 0) < self.max_batch_size:
                self._wakeup.clear()
                await self._wakeup.wait()
        finally:
            timer.cancel()

    def _forget(self, item: _Item) -> None:
        left = self._rows[item.key] - item.rows
        if left:
            self._rows[item.key] = left
        else:
            del self._rows[item.key]

    def _take(self, key) -> list[_Item]:
        """The head request and the queued ones that fit with it, up to max_batch_size rows, oldest first."""
        batch, rows, keep = [], 0, collections.deque()
        for it in self._pending:
            if it.key == key and not it.gone() and (not batch or rows + it.rows <= self.max_batch_size):
                batch.append(it)
                rows += it.rows
                self._forget(it)
            elif it.gone():
                self._forget(it)
            else:
                keep.append(it)
        self._pending = keep
        return batch

    async def _run(self, batch: list[_Item]) -> None:
        start = time.perf_counter()
        observe_many(self._queue_seconds, [start - it.enqueued for it in batch])
        feeds, rows = [it.feeds for it in batch], [it.rows for it in batch]
        compute = self._compute_split if self.split else self._compute  # the split too in the worker thread
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, compute, feeds, rows)
        finally:
            self._last_end = time.perf_counter()
        for it, res in zip(batch, results):
            it.resolve(res)

    # -- in the worker thread ---------------------------------------------------------------------
    def _compute_split(self, requests: list[dict[str, np.ndarray]], rows: list[int]) -> list:
        return [r.arrays() if isinstance(r, Rows) else r for r in self._compute(requests, rows)]

    def _compute(self, requests: list[dict[str, np.ndarray]], rows: list[int] | None = None) -> list:
        """Merge and run (`rows`: each request's, where known); per request its `Rows` or the exception to raise for it."""
        try:
            t0 = time.perf_counter()
            rows = rows or [self.sig.rows(r) for r in requests]
            bucket = self.bucket(sum(rows)) if self.runner.buckets and self.sig.batchable else None
            inputs, plan = self.sig.merge(requests, bucket, self.runner.buffer, rows)
            t1 = time.perf_counter()
            outputs = self.runner.run(inputs)
            t2 = time.perf_counter()
            batch = BatchOutputs(self.sig, outputs, plan)
            results = [Rows(batch, i) for i in range(len(requests))]
            phases = dict(self.runner.phases)  # the runner's own split of its run: copies in, the module, copies out
            phases["input"] = phases.get("input", 0.0) + t1 - t0
            phases["infer"] = phases.get("infer", t2 - t1)
            phases["output"] = phases.get("output", 0.0) + time.perf_counter() - t2
            self.metrics.count_batch(self.sig.name, sum(plan.rows), len(requests), phases)
            return results
        except WorkerCrashed as err:
            self.metrics.worker_restarts.labels(self.sig.name).inc()
            log.warning("worker crashed", extra={"fields": {"model": self.sig.name, "batch_requests": len(requests), "error": str(err)}})
            if len(requests) == 1:
                return [ProtocolError(f"{err} on this request run alone; its inputs are probably outside what the model "
                                      f"accepts (e.g. an index beyond the size of a table)", 400)]
        except InputError as err:
            if len(requests) == 1:
                return [ProtocolError(str(err), 400)]
        except Exception as err:  # noqa: BLE001 - reported as a 500 to this batch's requests
            log.exception("batch failed", extra={"fields": {"model": self.sig.name}})
            return [RuntimeError(f"model {self.sig.name!r} failed: {err}")] * len(requests)
        return [r for one in requests for r in self._compute([one])]  # find the request at fault
