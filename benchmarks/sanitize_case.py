"""One small persistent-kernel layer under compute-sanitizer (racecheck / synccheck): a few steps, batch 2.

    python3 benchmarks/sanitize_case.py [KERNEL [LSTM|GRU [streamed|ring|ring-h|h0]]]
    python3 benchmarks/sanitize_case.py wavefront     two stacked LSTM layers in one wavefront kernel
    python3 benchmarks/sanitize_case.py mma_wavefront three stacked fp16 LSTM layers in the tensor-core wavefront (batch 40)
    python3 benchmarks/sanitize_case.py persistent_mma_wavefront   the same in the persistent tensor-core wavefront: batch 6
                                  of a bound of 8 (one 8-row pass), 20 of 24 (one partial 32-row pass), then 40 of 64
                                  (one partial 64-row pass)
    python3 benchmarks/sanitize_case.py persistent LSTM sync   the persistent kernel with sync=1 (steps wait on h's tagged words)
    python3 benchmarks/sanitize_case.py persistent_mma LSTM sync   the same in persistent_mma, fp16 (h's tagged half words;
                                  GRU: with linear_before_reset, the one-phase GRU that polls)
    python3 benchmarks/sanitize_case.py persistent_mma LSTM sync-mid   the same at batch 12 (the polled two-tile point,
                                  one partial 16-row pass)
    python3 benchmarks/sanitize_case.py cluster GRU [sync|grid]   the cluster kernel, hidden 128 (h through distributed
                                  shared memory, a cluster barrier a phase or with sync mbarriers; GRU's two phases; R in
                                  registers; grid: two clusters a direction, the other's units polled and forwarded)

streamed (persistent_mma only): half of each block's R read from global memory every step (the path layers too large
for shared memory run), instead of all of it resident. ring: hidden 128, three of its four chunks streamed through
the cp.async ring (two buffers of two chunks, a partial second round) that two batch warps read; ring-h: the same with
h's chunks copied into the ring too; ring-h-halves: that in exact fp32's f16x3 steps. h0: the layer takes initial_h (exact fp32's f16x3 steps then find h's scale from
max |h0| across the grid before storing h0's halves).
"""

import dataclasses
import sys

import numpy as np

sys.path.insert(0, "tests")
import tvmrnn  # noqa: E402
from onnx_cases import Case  # noqa: E402

from schedules import recurrent_cluster, recurrent_persistent, recurrent_persistent_mma  # noqa: E402
from schedules.recurrent_mma import MmaConfig  # noqa: E402

kernel = sys.argv[1] if len(sys.argv) > 1 else "persistent"
if sys.argv[3:] == ["streamed"]:
    # hidden 64: two 32-column chunks, the second streamed
    recurrent_persistent_mma.default_config = lambda *_, **__: MmaConfig(units=8, n_tiles=1, n_warps=1, k_warps=2, depth=1, prefetch=1, streamed=1)
if sys.argv[3:] in (["ring"], ["ring-h"], ["ring-h-halves"]):
    recurrent_persistent_mma.default_config = lambda *_, **__: MmaConfig(units=8, n_tiles=1, n_warps=2, k_warps=2, depth=1, prefetch=1,
                                                                        streamed=3, ring=2, ring_h=int(sys.argv[3] != "ring"),
                                                                        halves=int(sys.argv[3] == "ring-h-halves"))
POLLED = (["sync"], ["sync-mid"])
if sys.argv[3:] in POLLED:
    _module = {"cluster": recurrent_cluster, "persistent_mma": recurrent_persistent_mma}.get(kernel, recurrent_persistent)
    _default = _module.default_config
    _module.default_config = lambda *a, **k: dataclasses.replace(_default(*a, **k), sync=1)
if sys.argv[3:] == ["grid"]:  # two clusters of 8 CTAs a direction: units forwarded through tagged words
    recurrent_cluster.default_config = lambda spec, *_: recurrent_cluster.ClusterConfig(
        ctas=8, clusters=2, warps=8, sync=1).with_registers(spec)
# stacked kernels: (float16, layers, input size, [(batch bound, batch), ...])
STACKS = {"wavefront": (False, 2, 16, [(2, 2)]),
          "mma_wavefront": (True, 3, 16, [(64, 40)]),  # two 32-row batch tiles, the second partial
          # one 8-row pass; one partial 32-row pass; one partial 64-row pass
          "persistent_mma_wavefront": (True, 3, 32, [(8, 6), (24, 20), (64, 40)])}
if kernel in STACKS:
    from test_wavefront import lstm_stack, stack_model, stack_reference

    half, layers, inputs, runs = STACKS[kernel]
    cases = [dataclasses.replace(c, dtype="float16" if half else "float32") for c in lstm_stack(layers, hidden=64, input_size=inputs)]
    for bound, batch in runs:
        module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 4, "batch": bound}, cuda_graph=False)
        feeds = {"X": np.random.default_rng(0).standard_normal((4, batch, inputs)).astype(cases[0].dtype)}
        ours, ref = module.run(feeds), stack_reference(cases, feeds)
        print(kernel, module.metadata["stacks"], {k: float(np.abs(v - ref[k]).max()) for k, v in ours.items()})
    sys.exit(0)
case = Case(op=sys.argv[2] if len(sys.argv) > 2 else "LSTM", direction="bidirectional",
            optional=("B", "sequence_lens") + (("initial_h",) if sys.argv[3:] == ["h0"] else ()),
            hidden=128 if sys.argv[3:] in (["ring"], ["ring-h"], ["ring-h-halves"]) or kernel == "cluster" else 64, input_size=16,
            dtype="float16" if kernel == "persistent_mma" and sys.argv[3:] in POLLED else "float32",
            linear_before_reset=int(sys.argv[2:3] == ["GRU"] and sys.argv[3:] in POLLED))  # a GRU polls in one phase only (PyTorch's kind)
module = tvmrnn.compile(case.model(), target="cuda", kernel=kernel)
feeds = case.feeds(np.random.default_rng(0), 4, 12 if sys.argv[3:] == ["sync-mid"] else 2)
ours, ref = module.run(feeds), case.reference(feeds)
print(kernel, case.op, module.metadata["layers"][0]["kernel"], {k: float(np.abs(v - ref[k]).max()) for k, v in ours.items()})
