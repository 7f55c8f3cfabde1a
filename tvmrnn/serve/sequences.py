"""Streaming state: the recurrent state of each live sequence, kept between its requests.

A request with parameter `sequence_id` (Triton's sequence batcher semantics; 0 or "" means none) belongs
to a sequence: `sequence_start` begins it (zero state, or restarts it), `sequence_end` drops its state after
the request. Requests of one sequence run one at a time, in arrival order. A sequence idle for longer than
`idle_s` is dropped. Starting one more than `max_sequences` live sequences is refused with 429.

The store holds arrays only; which inputs and outputs are state is the model's `Signature.state_pairs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import numpy as np

from .metrics import Metrics
from .protocol import ProtocolError


@dataclass
class Sequence:
    model: str
    id: int | str
    state: dict[str, np.ndarray] | None = None  # None: not run yet (zeros, or what the client sends)
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    live: bool = True


def sequence_params(parameters: dict) -> tuple[int | str | None, bool, bool]:
    """(sequence_id or None, start, end) from a request's parameters; ProtocolError if malformed."""
    sid = parameters.get("sequence_id")
    start, end = parameters.get("sequence_start", False), parameters.get("sequence_end", False)
    for key, val in (("sequence_start", start), ("sequence_end", end)):
        if not isinstance(val, bool):
            raise ProtocolError(f"parameter {key} must be true or false, got {str(val)[:40]!r}")
    if sid is None or sid == 0 or sid == "":
        if start or end:
            raise ProtocolError("sequence_start/sequence_end need a sequence_id parameter (a non-zero integer or a non-empty string)")
        return None, False, False
    if isinstance(sid, bool) or not isinstance(sid, (int, str)) or (isinstance(sid, int) and sid < 0) or len(str(sid)) > 256:
        raise ProtocolError(f"parameter sequence_id must be a non-negative integer or a string of at most 256 characters, got {str(sid)[:40]!r}")
    return sid, start, end


class SequenceStore:
    def __init__(self, max_sequences: int, idle_s: float, metrics: Metrics, clock=time.monotonic):
        self.max_sequences, self.idle_s, self.metrics, self.clock = max_sequences, idle_s, metrics, clock
        self._live: dict[tuple[str, int | str], Sequence] = {}

    def __len__(self) -> int:
        return len(self._live)

    def count(self, model: str) -> int:
        return sum(1 for m, _ in self._live if m == model)

    def expire(self) -> int:
        """Drop sequences idle for longer than idle_s (those not running a request); how many went."""
        now = self.clock()
        gone = [k for k, s in self._live.items() if self._stale(s, now)]
        for key in gone:
            self._drop(key)
            self.metrics.sequences_expired.labels(key[0]).inc()
        return len(gone)

    def _stale(self, seq: Sequence, now: float) -> bool:
        return not seq.lock.locked() and now - seq.last_used > self.idle_s

    def _drop(self, key) -> None:
        seq = self._live.pop(key, None)
        if seq is not None:
            seq.live = False
            self.metrics.active_sequences.labels(key[0]).set(self.count(key[0]))

    @contextlib.asynccontextmanager
    async def hold(self, model: str, sid, start: bool):
        """The sequence, locked for one request; `sequence_start` creates (or resets) it. Idle sequences are dropped here
        as the sweeper would: this one if stale, all of them before refusing a new one for their number."""
        key = (model, sid)
        seq = self._live.get(key)
        if seq is not None and self._stale(seq, self.clock()):
            self._drop(key)
            self.metrics.sequences_expired.labels(model).inc()
            seq = None
        created = seq is None
        if created:
            if not start:
                raise ProtocolError(f"sequence {sid!r} of model {model!r} is not live: it was never started, has ended, or was "
                                    f"idle for more than {self.idle_s:g} s; send it again with sequence_start=true")
            if len(self._live) >= self.max_sequences:
                self.expire()
            if len(self._live) >= self.max_sequences:
                raise ProtocolError(f"too many live sequences ({len(self._live)}, the limit set by --max-sequences); end one "
                                    f"with sequence_end=true or let it expire after {self.idle_s:g} s idle", 429)
            seq = self._live[key] = Sequence(model, sid)
            self.metrics.active_sequences.labels(model).set(self.count(model))
        async with seq.lock:
            if not seq.live:  # ended by the request ahead of us
                raise ProtocolError(f"sequence {sid!r} of model {model!r} ended while this request waited for it")
            if start:
                seq.state = None
            try:
                yield seq
            except BaseException:
                if created and seq.state is None:  # a start that failed holds no slot
                    self.end(seq)
                raise
            finally:
                seq.last_used = self.clock()

    def end(self, seq: Sequence) -> None:
        if self._live.get((seq.model, seq.id)) is seq:
            self._drop((seq.model, seq.id))

    async def sweep_forever(self) -> None:
        """Expire idle sequences in the background (also done on every sequence request)."""
        period = max(0.05, min(self.idle_s / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            self.expire()
