"""One small persistent-kernel layer under compute-sanitizer (racecheck / synccheck): a few steps, batch 2."""

import sys

import numpy as np

sys.path.insert(0, "tests")
import tvmrnn  # noqa: E402
from onnx_cases import Case  # noqa: E402

kernel = sys.argv[1] if len(sys.argv) > 1 else "persistent"
case = Case(op=sys.argv[2] if len(sys.argv) > 2 else "LSTM", direction="bidirectional", optional=("B", "sequence_lens"), hidden=64, input_size=16)
module = tvmrnn.compile(case.model(), target="cuda", kernel=kernel)
feeds = case.feeds(np.random.default_rng(0), 4, 2)
ours, ref = module.run(feeds), case.reference(feeds)
print(kernel, case.op, {k: float(np.abs(v - ref[k]).max()) for k, v in ours.items()})
