"""Prometheus metrics of the inference service, per model, in a registry of its own (served at /metrics).

Requests whose model is not served are counted under model="" so a client cannot grow the label set.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("tvmrnn_requests", "Inference requests, by model and HTTP status", ["model", "status"], registry=r)
        self.errors = Counter("tvmrnn_request_errors", "Inference requests answered with an error, by model and HTTP status",
                              ["model", "status"], registry=r)
        self.request_seconds = Histogram("tvmrnn_request_seconds", "Time from receiving an infer request to answering it",
                                         ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram("tvmrnn_queue_seconds", "Time a request waited for its batch to start",
                                       ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.compute_seconds = Histogram("tvmrnn_compute_seconds", "Time to merge, run and split one batch",
                                         ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("tvmrnn_batch_size", "Rows (batch-dim entries) per executed batch",
                                    ["model"], buckets=_BATCH_BUCKETS, registry=r)
        self.batch_requests = Histogram("tvmrnn_batch_requests", "Requests per executed batch",
                                        ["model"], buckets=_BATCH_BUCKETS, registry=r)
        self.active_sequences = Gauge("tvmrnn_active_sequences", "Streaming sequences holding state", ["model"], registry=r)
        self.sequences_expired = Counter("tvmrnn_sequences_expired", "Sequences dropped after --sequence-idle-s idle",
                                         ["model"], registry=r)
        self.worker_restarts = Counter("tvmrnn_worker_restarts", "Model worker processes restarted after a crash",
                                       ["model"], registry=r)

    def count_request(self, model: str, status: int, seconds: float | None = None) -> None:
        self.requests.labels(model, str(status)).inc()
        if status >= 400:
            self.errors.labels(model, str(status)).inc()
        if seconds is not None and status < 400:
            self.request_seconds.labels(model).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
