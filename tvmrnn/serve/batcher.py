"""Dynamic batching: concurrent requests for one model run as one batch.

Requests queue per model. A batch starts from the oldest queued request and takes the queued requests
that can join it (equal group key: same shapes off the batch and padded axes, see `Signature.group_key`)
until it has `max_batch_size` rows or `max_delay_s` has passed since that oldest request arrived.
It is merged, run and split back in the model's own worker thread, so the event loop goes on parsing requests while
it runs (`inline`: on the event loop itself, where the loop has nothing else to do: a model's engine process). One
batch runs at a time per model. A runner with `buckets` (a module on the GPU) gets its
batches padded to a bucket and assembled into its own buffers (`runner.buffer`), so its shapes repeat.

When a batch crashes the model's worker process (see `workers.py`) or fails the runtime's input checks,
its requests are re-run one by one so only the request at fault fails.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .metrics import Metrics
from .protocol import ProtocolError
from .signature import Signature
from .workers import WorkerCrashed

log = logging.getLogger("tvmrnn.serve")


class ShuttingDown(ProtocolError):
    def __init__(self, model: str):
        super().__init__(f"model {model!r} is shutting down", 503)


@dataclass
class _Item:
    feeds: dict[str, np.ndarray]
    rows: int
    key: object
    future: asyncio.Future
    enqueued: float


class Batcher:
    def __init__(self, sig: Signature, runner, max_batch_size: int, max_delay_s: float, metrics: Metrics, inline: bool = False):
        self.sig, self.runner, self.metrics, self.inline = sig, runner, metrics, inline
        self.max_batch_size, self.max_delay_s = max_batch_size, max_delay_s
        self._pending: collections.deque[_Item] = collections.deque()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"tvmrnn-{sig.name}")
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.sig.name}")

    async def submit(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Queue one checked request; its outputs (all of the model's) when its batch has run."""
        if self._closing or self._task is None:
            raise ShuttingDown(self.sig.name)
        item = _Item(feeds, self.sig.rows(feeds), self.sig.group_key(feeds),
                     asyncio.get_running_loop().create_future(), time.perf_counter())
        self._pending.append(item)
        self._wakeup.set()
        return await item.future

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
    def _ready_rows(self, key) -> int:
        return sum(it.rows for it in self._pending if it.key == key)

    async def _loop(self) -> None:
        while True:
            while self._pending and self._pending[0].future.done():  # the client went away
                self._pending.popleft()
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            head = self._pending[0]
            deadline = head.enqueued + self.max_delay_s
            while (self.sig.batchable and not self._closing and self._ready_rows(head.key) < self.max_batch_size
                   and time.perf_counter() < deadline):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), deadline - time.perf_counter())
                except asyncio.TimeoutError:
                    break
            batch = self._take(head.key)
            try:
                await self._run(batch)
            except Exception as err:  # noqa: BLE001 - never let one batch end the loop
                log.exception("batch failed", extra={"fields": {"model": self.sig.name}})
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(err)

    def _take(self, key) -> list[_Item]:
        """The head request and the queued ones that fit with it, up to max_batch_size rows, oldest first."""
        batch, rows, keep = [], 0, collections.deque()
        while self._pending:
            it = self._pending.popleft()
            if it.future.done():
                continue
            if it.key == key and (not batch or rows + it.rows <= self.max_batch_size):
                batch.append(it)
                rows += it.rows
            else:
                keep.append(it)
        self._pending = keep
        return batch

    async def _run(self, batch: list[_Item]) -> None:
        start = time.perf_counter()
        for it in batch:
            self.metrics.queue_seconds.labels(self.sig.name).observe(start - it.enqueued)
        feeds = [it.feeds for it in batch]
        if self.inline:
            results = self._compute(feeds)
        else:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self._compute, feeds)
        for it, res in zip(batch, results):
            if it.future.done():
                continue
            if isinstance(res, BaseException):
                it.future.set_exception(res)
            else:
                it.future.set_result(res)

    # -- in the worker thread ---------------------------------------------------------------------
    def _compute(self, requests: list[dict[str, np.ndarray]]) -> list:
        """Merge, run, split; per request its outputs or the exception to raise for it."""
        try:
            t0 = time.perf_counter()
            rows = sum(self.sig.rows(r) for r in requests)
            bucket = self.bucket(rows) if self.runner.buckets and self.sig.batchable else None
            inputs, plan = self.sig.merge(requests, bucket, self.runner.buffer)
            t1 = time.perf_counter()
            outputs = self.runner.run(inputs)
            t2 = time.perf_counter()
            results = self.sig.split(outputs, plan)
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
