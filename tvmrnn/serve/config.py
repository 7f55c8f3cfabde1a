"""The service's settings (what `tvmrnn serve` resolves from its options), shared by the app and the model loader."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServeConfig:
    max_batch_size: int = 32  # rows per batch (the batch dim summed over the requests in it)
    max_delay_ms: float = 5.0  # how long the oldest queued request waits for others to join its batch
    max_request_bytes: int = 64 * 2**20  # larger request bodies get 413
    sequence_idle_s: float = 60.0  # a streaming sequence idle for longer is dropped
    max_sequences: int = 1024  # live streaming sequences, all models together; more get 429
    isolation: str = "auto"  # "process" (a worker process per model), "thread" (the server), "auto": workers.in_process_by_default
    http_workers: int = 1  # HTTP front-end processes; more than 1 moves each model's batching into an engine process
    device: str | None = None  # None: the module's own target (cuda or cpu)
    state: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # model -> [(state input, state output)]
    threads: int | None = None  # TVM CPU threads per model worker (TVM_NUM_THREADS; process isolation); None: TVM's default
    graceful_timeout_s: float = 30.0  # on SIGTERM/SIGINT, how long in-flight requests get to finish
