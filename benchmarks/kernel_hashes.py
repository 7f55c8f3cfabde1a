"""The recurrent kernels' generated CUDA for every bench row's layers (both dtypes, default plans, sm_90a), hashed: run
at two commits and compare, to show which rows a change touched (no GPU needed; CUDA source through NVRTC's build path).

    PYTHONPATH=<checkout> python3 benchmarks/kernel_hashes.py OUT.json
"""
import hashlib, json, sys
import tvm
from tvmrnn import bench
from tvmrnn.cells import cell_for
from tvmrnn.frontend.inspect import find_rnn_layers
from schedules import cooperative, recurrent_kernel
target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
out = {}
for row in bench.ROWS:
    for dtype in ("float32", "float16"):
        specs = {l.spec for l in find_rnn_layers(bench.onnx_model(bench.torch_module(row), row, dtype))}
        hs = []
        for spec in sorted(specs, key=repr):
            k = recurrent_kernel(spec, cell_for(spec), target)
            src = tvm.tirx.build(k.func, target=target, pipeline=cooperative.register()).imports[0].inspect_source()
            hs.append(hashlib.sha256(src.encode()).hexdigest()[:12])
        out[f"{row.name}/{dtype}"] = hs
        print(row.name, dtype, hs, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
