"""Prometheus metrics of the inference service, per model, in a registry of its own (served at /metrics), and Triton's
statistics extension (`GET /v2/models/NAME/stats`) read back from them.

Requests whose model is not served are counted under model="" so a client cannot grow the label set.
With several HTTP workers (`--http-workers`), every process of the service writes its metrics to
PROMETHEUS_MULTIPROC_DIR and any worker's /metrics and /stats sum them (prometheus_client's multiprocess mode).

A batch's time is split in three phases, as Triton's statistics split it: `input` (assembling the requests into the
batch's buffers and copying them to the device), `infer` (running the module, to its end on the device) and `output`
(copying the outputs back and splitting them per request).
"""

from __future__ import annotations

import asyncio
import bisect
import os
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)
PHASES = ("input", "infer", "output")


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def _keep_pid() -> None:
    """In multiprocess mode every update of a metric asks os.getpid() (a system call), to notice a fork; here the pid is
    kept, and refreshed in a forked child, so an update is a lock and a write to the process's mmap file."""
    from prometheus_client import values

    pid = [os.getpid()]
    os.register_at_fork(after_in_child=lambda: pid.__setitem__(0, os.getpid()))
    values.ValueClass = values.MultiProcessValue(lambda: pid[0])


if multiprocess():
    _keep_pid()


def observe_many(histogram, values: list[float]) -> None:
    """`histogram.observe(v)` for each of `values` (a histogram's child, labels given), with one update of its sum and of
    each bucket the values fall in, not one per value: in multiprocess mode every update takes a lock and writes to the
    process's mmap file. Histogram keeps the count of each bucket alone (the exposition sums them) and its sum."""
    counts: dict[int, int] = {}
    bounds = histogram._upper_bounds
    for v in values:
        i = bisect.bisect_left(bounds, v)  # the first bucket whose bound is >= v, as Histogram.observe finds it
        counts[i] = counts.get(i, 0) + 1
    histogram._sum.inc(sum(values))
    for i, n in counts.items():
        histogram._buckets[i].inc(n)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("tvmrnn_requests", "Inference requests, by model and HTTP status", ["model", "status"], registry=r)
        self.errors = Counter("tvmrnn_request_errors", "Inference requests answered with an error, by model and HTTP status",
                              ["model", "status"], registry=r)
        self.error_seconds = Counter("tvmrnn_request_error_seconds", "Time spent on requests answered with an error",
                                     ["model"], registry=r)
        self.request_seconds = Histogram("tvmrnn_request_seconds", "Time from receiving an infer request to answering it",
                                         ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram("tvmrnn_queue_seconds", "Time a request waited for its batch to start",
                                       ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.compute_seconds = Histogram("tvmrnn_compute_seconds", "Time to merge, run and split one batch",
                                         ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.phase_seconds = Histogram("tvmrnn_batch_phase_seconds", "Time of one batch's phase: input, infer, output",
                                       ["model", "phase"], buckets=_LATENCY_BUCKETS, registry=r)
        self.request_phase_seconds = Counter("tvmrnn_request_phase_seconds", "Batch phase time summed over the requests in "
                                             "the batch (Triton's per-request compute statistics)", ["model", "phase"], registry=r)
        self.batch_size = Histogram("tvmrnn_batch_size", "Rows (batch-dim entries) per executed batch",
                                    ["model"], buckets=_BATCH_BUCKETS, registry=r)
        self.batch_requests = Histogram("tvmrnn_batch_requests", "Requests per executed batch",
                                        ["model"], buckets=_BATCH_BUCKETS, registry=r)
        self.last_inference = Gauge("tvmrnn_last_inference_timestamp_seconds", "When the model last ran a batch",
                                    ["model"], registry=r, multiprocess_mode="max")
        self.active_sequences = Gauge("tvmrnn_active_sequences", "Streaming sequences holding state", ["model"], registry=r,
                                      multiprocess_mode="livesum")
        self.sequences_expired = Counter("tvmrnn_sequences_expired", "Sequences dropped after --sequence-idle-s idle",
                                         ["model"], registry=r)
        self._ok: dict[str, tuple] = {}  # model -> (its 200s counter, its request_seconds histogram)
        self._ok_pending: dict[str, list[float]] = {}  # model -> seconds of the 200s not counted yet (see flush)
        self.worker_restarts = Counter("tvmrnn_worker_restarts", "Model worker processes restarted after a crash",
                                       ["model"], registry=r)

    def count_request(self, model: str, status: int, seconds: float | None = None) -> None:
        if status == 200 and seconds is not None:  # the common case: counted at the end of this turn of the event loop
            pending = self._ok_pending.get(model)
            if pending is None:
                pending = self._ok_pending[model] = []
            if not any(self._ok_pending.values()):
                asyncio.get_running_loop().call_soon(self.flush)
            pending.append(seconds)
            return
        self.requests.labels(model, str(status)).inc()
        if status >= 400:
            self.errors.labels(model, str(status)).inc()
            if seconds is not None:
                self.error_seconds.labels(model).inc(seconds)
        elif seconds is not None:
            self.request_seconds.labels(model).observe(seconds)

    def flush(self) -> None:
        """Count the 200s that `count_request` holds: one update per counter and histogram bucket, not per request."""
        for model, pending in self._ok_pending.items():
            if pending:
                children = self._ok.get(model)
                if children is None:
                    children = self._ok[model] = (self.requests.labels(model, "200"), self.request_seconds.labels(model))
                children[0].inc(len(pending))
                observe_many(children[1], pending)
                pending.clear()

    def count_batch(self, model: str, rows: int, requests: int, phases: dict[str, float]) -> None:
        self.compute_seconds.labels(model).observe(sum(phases.values()))
        for phase, seconds in phases.items():
            self.phase_seconds.labels(model, phase).observe(seconds)
            self.request_phase_seconds.labels(model, phase).inc(seconds * requests)
        self.batch_size.labels(model).observe(rows)
        self.batch_requests.labels(model).observe(requests)
        self.last_inference.labels(model).set(time.time())

    def _collecting_registry(self) -> CollectorRegistry:
        if not multiprocess():
            return self.registry
        from prometheus_client import multiprocess as mp

        registry = CollectorRegistry()
        mp.MultiProcessCollector(registry)
        return registry

    def exposition(self) -> tuple[bytes, str]:
        self.flush()
        return generate_latest(self._collecting_registry()), CONTENT_TYPE_LATEST

    def samples(self, model: str) -> dict[tuple[str, str], float]:
        """(sample name, phase or status label) -> value, summed, for one model."""
        self.flush()
        out: dict[tuple[str, str], float] = {}
        for family in self._collecting_registry().collect():
            for s in family.samples:
                if s.labels.get("model") == model and "le" not in s.labels:
                    key = (s.name, s.labels.get("phase") or s.labels.get("status") or "")
                    out[key] = out.get(key, 0.0) + s.value
        return out

    def triton_stats(self, model: str, version: str) -> dict:
        """One entry of Triton's `model_stats`: counts, and durations in ns, as tritonclient's get_inference_statistics reads them."""
        s = self.samples(model)

        def get(name, label=""):
            return s.get((name, label), 0.0)

        def stat(count, seconds):
            return {"count": int(count), "ns": int(seconds * 1e9)}

        fail = sum(v for (n, _), v in s.items() if n == "tvmrnn_request_errors_total")
        executed = get("tvmrnn_batch_requests_sum")
        inference = {"success": stat(get("tvmrnn_request_seconds_count"), get("tvmrnn_request_seconds_sum")),
                     "fail": stat(fail, get("tvmrnn_request_error_seconds_total")),
                     "queue": stat(get("tvmrnn_queue_seconds_count"), get("tvmrnn_queue_seconds_sum")),
                     "cache_hit": stat(0, 0), "cache_miss": stat(0, 0)}
        for phase in PHASES:
            inference[f"compute_{phase}"] = stat(executed, get("tvmrnn_request_phase_seconds_total", phase))
        return {"name": model, "version": version, "last_inference": int(get("tvmrnn_last_inference_timestamp_seconds") * 1000),
                "inference_count": int(get("tvmrnn_batch_size_sum")), "execution_count": int(get("tvmrnn_batch_size_count")),
                "inference_stats": inference, "batch_stats": [], "memory_usage": []}
