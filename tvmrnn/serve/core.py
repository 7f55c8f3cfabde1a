"""One model's inference behind the HTTP routes: checks, streaming state, dynamic batching.

`ModelCore` does it in this process (its batcher and the sequence store); `engine.RemoteCore` hands the same call to
the model's engine process, which runs a `ModelCore` (several HTTP workers, one batcher per model). Both answer
`await core.infer(feeds, datatypes, sequence_id, start, end)` with all of the model's outputs, or raise ProtocolError.
"""

from __future__ import annotations

import numpy as np

from .batcher import Batcher
from .protocol import ProtocolError
from .sequences import SequenceStore
from .signature import Signature


class ModelCore:
    def __init__(self, name: str, sig: Signature, batcher: Batcher, sequences: SequenceStore):
        self.name, self.sig, self.batcher, self.sequences = name, sig, batcher, sequences

    async def infer(self, feeds: dict[str, np.ndarray], datatypes: dict[str, str], sid=None, start: bool = False,
                    end: bool = False, checked: bool = False) -> dict[str, np.ndarray]:
        """checked: the request was checked already (Signature.check, by an HTTP worker)."""
        if sid is None:
            if not checked:
                self.sig.check(feeds, datatypes)
            return await self.batcher.submit(feeds)
        return await self._infer_in_sequence(feeds, datatypes, sid, start, end)

    def enqueue(self, feeds: dict[str, np.ndarray], deliver) -> None:
        """A checked request outside any sequence, with no task waiting on it: `deliver(outputs or exception)` once run."""
        self.batcher.enqueue(feeds, deliver)

    async def _infer_in_sequence(self, feeds, datatypes, sid, seq_start: bool, seq_end: bool) -> dict:
        sig = self.sig
        if not sig.state_pairs:
            raise ProtocolError(f"model {self.name!r} has no state inputs paired with outputs (inputs NAME_in with outputs "
                                f"NAME_out, or --state {self.name}:INPUT=OUTPUT), so it cannot keep a sequence's state")
        async with self.sequences.hold(self.name, sid, seq_start) as seq:
            feeds = dict(feeds)
            for i, _ in sig.state_pairs:
                if i not in feeds:
                    feeds[i] = seq.state[i] if seq.state is not None else sig.zero_state(i, feeds)
            try:
                sig.check(feeds, datatypes)
            except ProtocolError as err:
                if any(repr(i) in str(err) for i, _ in sig.state_pairs) and seq.state is not None:
                    raise ProtocolError(f"{err} (the state inputs of sequence {sid!r} hold the state of its previous request)") from None
                raise
            outputs = await self.batcher.submit(feeds)
            seq.state = {i: outputs[o] for i, o in sig.state_pairs}
            if seq_end:
                self.sequences.end(seq)
        return outputs
