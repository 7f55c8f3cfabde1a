"""Benchmark suite: our compiled layers against cuDNN (torch.nn.LSTM/GRU) and, on the CPU, ONNX Runtime and PyTorch.

Each row is built as an ONNX model (stacked layers glued as exporters do: Transpose + Reshape)
with the weights of a torch module, compiled with tvmrnn (bounded to the row's shape, as a deployment
would be, so each run replays as one CUDA graph), checked against torch's output, then
timed in the same process on the same inputs: CUDA events after warm-up, the median of
`repeats` runs, inputs rotated among several sets so no cache flatters anyone.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper


@dataclass(frozen=True)
class Row:
    name: str
    cell: str
    T: int
    N: int
    I: int
    H: int
    layers: int = 1
    bidirectional: bool = False

    @property
    def D(self):
        return 2 if self.bidirectional else 1

    def flops(self) -> float:
        """2 * multiply-adds of all input projections and recurrent products."""
        G = {"LSTM": 4, "GRU": 3}[self.cell]
        total = 0
        for layer in range(self.layers):
            In = self.I if layer == 0 else self.D * self.H
            total += 2 * self.T * self.N * self.D * G * self.H * (In + self.H)
        return total


ROWS = [
    Row("ds2-lstm", "LSTM", 300, 20, 800, 800),
    Row("ds2-gru", "GRU", 300, 20, 800, 800),
    Row("ds2-5l-bi", "LSTM", 300, 20, 800, 800, 5, True),
    Row("blog-a", "LSTM", 200, 64, 2560, 2560),
    Row("blog-b", "LSTM", 200, 64, 64, 256, 3),
    Row("lat-b1-h512-l2", "LSTM", 100, 1, 512, 512, 2),
    Row("lat-b1-h1024", "LSTM", 100, 1, 1024, 1024),
    Row("b8-h1024-l2", "LSTM", 100, 8, 1024, 1024, 2),
    Row("b64-h1024-l2", "LSTM", 100, 64, 1024, 1024, 2),
]
# one layer, input size = H, 1000 steps: the per-step cost at small batch, where cuDNN's persistent algorithms are fastest
# (issue #32's table (b), and the small layers of its 0.8 us mark at batch 1, where cuDNN's graph replay is fastest)
STEP_ROWS = [
    Row("step-lstm-h64-b1", "LSTM", 1000, 1, 64, 64),
    Row("step-gru-h64-b1", "GRU", 1000, 1, 64, 64),
    Row("step-lstm-h128-b1", "LSTM", 1000, 1, 128, 128),
    Row("step-gru-h128-b1", "GRU", 1000, 1, 128, 128),
    Row("step-lstm-h256-b1", "LSTM", 1000, 1, 256, 256),
    Row("step-gru-h512-b1", "GRU", 1000, 1, 512, 512),
    Row("step-lstm-h512-b1", "LSTM", 1000, 1, 512, 512),
    Row("step-lstm-h1024-b1", "LSTM", 1000, 1, 1024, 1024),
    Row("step-gru-h1024-b1", "GRU", 1000, 1, 1024, 1024),
    Row("step-lstm-h1024-b8", "LSTM", 1000, 8, 1024, 1024),
    Row("step-lstm-h1024-b16", "LSTM", 1000, 16, 1024, 1024),
    Row("step-gru-h1024-b16", "GRU", 1000, 16, 1024, 1024),
    Row("step-lstm-h1024-b64", "LSTM", 1000, 64, 1024, 1024),
]
CPU_ROWS = ("ds2-lstm", "ds2-gru", "lat-b1-h512-l2")
# torch's gate order -> ONNX's: LSTM (i, f, g, o) -> (i, o, f, c); GRU (r, z, n) -> (z, r, h)
_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2]}


def torch_module(row: Row, seed=0):
    import torch

    torch.manual_seed(seed)
    cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}[row.cell]
    return cls(row.I, row.H, num_layers=row.layers, bidirectional=row.bidirectional).eval()


def _onnx_weights(module, row: Row, layer: int):
    """W [D, G*H, In], R [D, G*H, H], B [D, 2*G*H] of one layer in ONNX's gate order."""
    H = row.H

    def reorder(t):
        t = t.detach().float().cpu().numpy()
        return np.concatenate([t[g * H:(g + 1) * H] for g in _ORDER[row.cell]])

    Ws, Rs, Bs = [], [], []
    for suffix in [""] + (["_reverse"] if row.bidirectional else []):
        p = lambda n: getattr(module, f"{n}_l{layer}{suffix}")  # noqa: E731
        Ws.append(reorder(p("weight_ih")))
        Rs.append(reorder(p("weight_hh")))
        Bs.append(np.concatenate([reorder(p("bias_ih")), reorder(p("bias_hh"))]))
    return np.stack(Ws), np.stack(Rs), np.stack(Bs)


def onnx_model(module, row: Row, dtype="float32") -> onnx.ModelProto:
    """The row as an ONNX graph: X [seq, batch, I] -> stacked layers -> Y [seq, batch, D*H]."""
    nodes, inits, x = [], [], "X"
    elem = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    inits.append(onnx.numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flatten_dirs"))
    for layer in range(row.layers):
        W, R, B = (w.astype(dtype) for w in _onnx_weights(module, row, layer))
        names = [f"W{layer}", f"R{layer}", f"B{layer}"]
        inits += [onnx.numpy_helper.from_array(v, n) for v, n in zip((W, R, B), names)]
        attrs = {"hidden_size": row.H, "direction": "bidirectional" if row.bidirectional else "forward"}
        if row.cell == "GRU":
            attrs["linear_before_reset"] = 1  # torch's GRU
        nodes.append(helper.make_node(row.cell, [x] + names, [f"Y{layer}"], name=f"{row.cell.lower()}{layer}", **attrs))
        nodes.append(helper.make_node("Transpose", [f"Y{layer}"], [f"Yt{layer}"], perm=[0, 2, 1, 3]))
        x = f"H{layer}" if layer < row.layers - 1 else "Y"
        nodes.append(helper.make_node("Reshape", [f"Yt{layer}", "flatten_dirs"], [x]))
    graph = helper.make_graph(nodes, row.name, [helper.make_tensor_value_info("X", elem, ["seq", "batch", row.I])],
                              [helper.make_tensor_value_info("Y", elem, ["seq", "batch", row.D * row.H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=10)


def _median_ms(run, inputs, repeats, warmup, sync, events):
    for i in range(warmup):
        run(inputs[i % len(inputs)])
    sync()
    times = []
    for i in range(repeats):
        if events:
            start, stop = events()
            start.record()
            run(inputs[i % len(inputs)])
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            run(inputs[i % len(inputs)])
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _interleaved_median_ms(runs: dict, inputs, repeats, warmup, block=5) -> dict:
    """Median wall ms of each of `runs` (name -> run(x)) over `repeats` timed runs, taken in rounds: per round each party
    runs `warmup` untimed runs, then `block` timed ones, inputs rotated. A shared CPU's speed drifts over seconds (this
    project's VM: 10-40% between runs), which one block per party would hand to whoever ran during a slow spell; one
    run per party per round would time each party against the others' thread pools still spinning after their runs
    (on the 2-core VM lat-b1-h512-l2 took 3x as long so, PyTorch 4-8x): so blocks, each after a warm-up."""
    times = {name: [] for name in runs}
    for r in range(-(-repeats // block)):
        for name, run in runs.items():
            for i in range(warmup):
                run(inputs[i % len(inputs)])
            for i in range(min(block, repeats - r * block)):
                t0 = time.perf_counter()
                run(inputs[(r * block + i) % len(inputs)])
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def bench_gpu_row(row: Row, kernels=("stepwise", "auto"), repeats=20, warmup=5, sets=3, dtype="float32", cudnn=None) -> dict:
    """Time our kernels against cuDNN on one row. cudnn: an earlier result of this row and dtype to reuse
    cuDNN's times and reference output from (a sweep of our variants need not re-time cuDNN each time)."""
    import torch

    import tvmrnn

    module = torch_module(row)
    model = onnx_model(module, row, dtype)
    tdtype = {"float32": torch.float32, "float16": torch.float16}[dtype]
    xs = [torch.randn(row.T, row.N, row.I, device="cuda", dtype=tdtype) for _ in range(sets)]
    events = lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # noqa: E731
    result = {"row": row.name, "dtype": dtype, "gflop": row.flops() / 1e9}
    if cudnn is not None:
        result.update({k: v for k, v in cudnn.items() if k.startswith("cudnn_")})
        xs, ref = cudnn["_inputs"], cudnn["_reference"]
    else:
        ref = _time_cudnn(module, row, xs, tdtype, dtype, repeats, warmup, events, result)
    # bounded to the row's shape, as a deployment would be, so the run replays as one CUDA graph (tvmrnn.cuda_graph)
    bounded = {"max_dims": {"seq": row.T, "batch": row.N}}
    for kernel in kernels:
        if kernel == "tf32" and dtype != "float32":
            continue
        try:  # "tuned": auto with the tuning logs; "tf32": auto with precision="tf32"; the others untuned defaults
            compiled = (tvmrnn.compile(model, target="cuda", **bounded) if kernel == "tuned" else
                        tvmrnn.compile(model, target="cuda", logs=False, precision="tf32", **bounded) if kernel == "tf32" else
                        tvmrnn.compile(model, target="cuda", kernel=kernel, logs=False, **bounded))
        except tvmrnn.UnsupportedModelError as err:  # e.g. persistent where R does not fit on chip
            result[f"{kernel}_kernel"] = f"n/a: {err}"
            continue
        layer = compiled.metadata["layers"][0]
        choice = f"{layer['kernel']}; input projection: {layer['projection']}"
        dev_inputs = [compiled.to_device({"X": x.cpu().numpy()}) for x in xs]
        ours = compiled.run({"X": xs[0].cpu().numpy()})["Y"]
        result[f"{kernel}_kernel"] = choice
        result[f"{kernel}_rel_err"] = _rel_err(ours, ref)
        result[f"{kernel}_ms"] = _median_ms(compiled.invoke, dev_inputs, repeats, warmup, torch.cuda.synchronize, events)
    best_cudnn, result["best_cudnn"] = min((v, k[:-3]) for k, v in result.items() if k.startswith("cudnn_") and k.endswith("_ms"))
    # the speed-up is exact fp32's (or the model's half precision); TF32, an opt-in, gets its own
    ours_ms = min(result[f"{k}_ms"] for k in kernels if f"{k}_ms" in result and k != "tf32")
    if "tuned_ms" in result and "auto_ms" in result:
        result["tuned_speedup"] = result["auto_ms"] / result["tuned_ms"]
    if "tf32_ms" in result:
        result["tf32_speedup"] = best_cudnn / result["tf32_ms"]
    result.update(ours_ms=ours_ms, best_cudnn_ms=best_cudnn, speedup=best_cudnn / ours_ms,
                  us_per_step_layer=ours_ms * 1e3 / (row.T * row.layers), tflops=row.flops() / (ours_ms * 1e-3) / 1e12)
    result["_inputs"], result["_reference"] = xs, ref  # for a later call's `cudnn=`; keys with "_" are not written
    return result


def _time_cudnn(module, row: Row, xs, tdtype, dtype, repeats, warmup, events, result: dict):
    """cuDNN on the row in every setting we know of, into `result`: PyTorch eager and replayed from a CUDA graph, each
    with TF32 allowed and not, and cuDNN's own algorithms (persistent ones included) through cudnnRNNForward. Returns
    the reference output (cuDNN in exact fp32 math, or the row's half precision)."""
    import torch

    from .cudnn_anchors import AnchorError, cuda_graph_ms, cudnn_algorithms

    net = module.cuda().to(tdtype)
    with torch.no_grad():
        for setting, tf32 in (("tf32", True), ("fp32", False)):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
            result[f"cudnn_{setting}_ms"] = _median_ms(lambda x: net(x), xs, repeats, warmup, torch.cuda.synchronize, events)
            result[f"cudnn_graph_{setting}_ms"] = cuda_graph_ms(net, xs, repeats, warmup)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        ref = net(xs[0])[0].float().cpu().numpy()
    try:
        result.update(cudnn_algorithms(row.cell, row.H, row.I, row.N, row.T, row.layers, row.D, dtype, repeats))
    except AnchorError as err:  # the table says why the persistent anchors are missing
        result["cudnn_algorithms_error"] = str(err)
    return ref


def bench_cpu_row(row: Row, repeats=5, warmup=1) -> dict:
    import onnxruntime as ort
    import torch

    import tvmrnn

    module = torch_module(row)
    model = onnx_model(module, row)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((row.T, row.N, row.I)).astype("f4") for _ in range(2)]
    compiled = tvmrnn.compile(model, target="llvm")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        ref = module(torch.from_numpy(xs[0]))[0].numpy()
        result = {"row": row.name, "dtype": "float32", "threads": torch.get_num_threads(),
                  "rel_err_vs_torch": _rel_err(compiled.run({"X": xs[0]})["Y"], ref)}
        result.update({f"{name}_ms": ms for name, ms in _interleaved_median_ms(
            {"ours": lambda x: compiled.run({"X": x}), "onnxruntime": lambda x: sess.run(None, {"X": x}),
             "torch": lambda x: module(torch.from_numpy(x))}, xs, repeats, warmup).items()})
    result["speedup_vs_ort"] = result["onnxruntime_ms"] / result["ours_ms"]
    result["speedup_vs_torch"] = result["torch_ms"] / result["ours_ms"]
    return result


def random_feeds(model: onnx.ModelProto, rng, dim=16) -> dict:
    """Inputs of the model's declared shapes (symbolic dims set to `dim`) and dtypes, normal floats or small ints."""
    feeds = {}
    inits = {i.name for i in model.graph.initializer}
    for i in model.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else dim for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        feeds[i.name] = (rng.standard_normal(shape) if dtype.kind == "f" else rng.integers(0, 4, shape)).astype(dtype)
    return feeds


def load_torch_factory(spec: str):
    """`MODULE:FACTORY` (e.g. `graph_cases:torch_net`): FACTORY(onnx_path) returns the torch.nn.Module the ONNX file was
    exported from, its forward taking the graph's inputs in order, or None for a file it does not know."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--torch {spec!r}: expected MODULE:FACTORY")
    return getattr(importlib.import_module(module), name)


def _ort_session(model: onnx.ModelProto, gpu: bool):
    """ONNX Runtime on the CUDA provider for a GPU run (None, with why, where this onnxruntime has none), else its CPU one."""
    import onnxruntime as ort

    if gpu and "CUDAExecutionProvider" not in ort.get_available_providers():
        return None, f"missing: onnxruntime {ort.__version__} has no CUDA provider (install onnxruntime-gpu)"
    providers = ["CUDAExecutionProvider"] if gpu else ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=providers)
    if gpu and sess.get_providers()[0] != "CUDAExecutionProvider":
        return None, f"missing: the CUDA provider did not load ({sess.get_providers()})"
    return sess, None


def _torch_run(net, input_names):
    """PyTorch eager on the GPU: inputs copied in, outputs synchronized (as our run and ONNX Runtime's return host arrays)."""
    import torch

    net = net.eval().cuda()

    def run(feeds):
        with torch.no_grad():
            out = net(*[torch.from_numpy(feeds[n]).cuda() for n in input_names])
        outs = out if isinstance(out, tuple | list) else (out,)
        return [o.cpu() for o in outs]

    return run


def bench_model(path, target="llvm", repeats=20, warmup=2, torch_factory=None, feeds=None, options=None, logs=False) -> dict:
    """A whole ONNX model: ours (compiled for `target` with compile's `options`, untuned unless `logs` names tuning logs
    as compile's `logs` does: None for its default folder and the bundled ones) against ONNX Runtime (its CPU
    provider, or CUDA's on a GPU) and, on a GPU where `torch_factory` knows the file, PyTorch eager, on the same inputs
    (`feeds`: a list of feed dicts, random by default), interleaved medians, and the largest relative error of any
    output against ONNX Runtime's CPU provider. Constant inputs (`options["consts"]`) go to ONNX Runtime and PyTorch
    only: compile folded them."""
    import onnxruntime as ort

    import tvmrnn

    model = onnx.load(str(path))
    gpu = target == "cuda"
    feeds = feeds or [random_feeds(model, np.random.default_rng(s)) for s in range(2)]
    consts = {k: np.asarray(v, np.int64) for k, v in ((options or {}).get("consts") or {}).items()}
    full = [{**f, **consts} for f in feeds]
    started = time.perf_counter()
    compiled = tvmrnn.compile(model, target=target, logs=logs, **(options or {}))
    compile_s = time.perf_counter() - started
    ours_feeds = [{k: v for k, v in f.items() if k in compiled.input_names} for f in feeds]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, full[0])
    ours = list(compiled.run(ours_feeds[0]).values())
    result = {"row": os.path.basename(str(path)), "compile_s": compile_s,
              "rel_err_vs_ort": max(_rel_err(o, r) for o, r in zip(ours, ref))}
    runs = {"ours": (compiled.run, ours_feeds)}
    sess, missing = _ort_session(model, gpu)
    if sess is None:  # its CPU provider then, as a deployment without onnxruntime-gpu would run it
        sess, _ = _ort_session(model, False)
        result["onnxruntime"] = "CPU provider (" + missing.removeprefix("missing: ") + ")"
    runs["onnxruntime"] = (lambda f: sess.run(None, f), full)
    net = torch_factory(str(path)) if gpu and torch_factory else None
    if net is not None:
        import torch

        if torch.cuda.is_available():
            runs["pytorch"] = (_torch_run(net, list(full[0])), full)
        else:
            result["pytorch"] = f"missing: torch {torch.__version__} has no CUDA"
    indexed = {name: (lambda i, run=run, fs=fs: run(fs[i])) for name, (run, fs) in runs.items()}
    result.update({f"{name}_ms": ms for name, ms in _interleaved_median_ms(indexed, range(len(feeds)), repeats, warmup).items()})
    others = [result[k] for k in ("onnxruntime_ms", "pytorch_ms") if k in result]
    if "onnxruntime_ms" in result:
        result["speedup_vs_ort"] = result["onnxruntime_ms"] / result["ours_ms"]
    if others:
        result["speedup_vs_fastest"] = min(others) / result["ours_ms"]
    return result


def environment(gpu: bool) -> dict:
    import torch
    import tvm

    from . import __version__

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "tvmrnn": __version__,
           "tvm": tvm.__version__, "torch": torch.__version__, "host": platform.node(), "cpu": platform.processor()}
    if gpu:
        env.update(gpu=torch.cuda.get_device_name(0), cudnn=torch.backends.cudnn.version(), cuda=torch.version.cuda)
        try:
            import subprocess

            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True).stdout.strip()
        except OSError:
            pass
    else:
        import onnxruntime

        env.update(onnxruntime=onnxruntime.__version__, cores=os.cpu_count(), cpu_model=_cpu_model())
    return env


GPU_COLUMNS = [("row", "row"), ("dtype", "dtype"), ("stepwise_ms", "stepwise ms"), ("persistent_ms", "persistent ms"), ("tiled_ms", "tiled ms"), ("mma_ms", "mma ms"),
               ("persistent_mma_ms", "persistent_mma ms"), ("auto_ms", "auto ms"),
               ("tuned_ms", "tuned ms"), ("tuned_speedup", "tuned ÷ auto"),
               ("cudnn_tf32_ms", "cuDNN TF32 ms"), ("cudnn_fp32_ms", "cuDNN fp32 ms"),
               ("cudnn_graph_tf32_ms", "cuDNN graph TF32 ms"), ("cudnn_graph_fp32_ms", "cuDNN graph fp32 ms"),
               ("cudnn_persist_static_default_ms", "cuDNN persist. static ms"),
               ("cudnn_persist_dynamic_default_ms", "cuDNN persist. dynamic ms"),
               ("cudnn_persist_static_tensor_ms", "cuDNN persist. static fp16 ms"),
               ("cudnn_persist_dynamic_tensor_ms", "cuDNN persist. dynamic fp16 ms"),
               ("best_cudnn_ms", "best cuDNN ms"), ("best_cudnn", "best cuDNN"), ("speedup", "speed-up"),
               ("us_per_step_layer", "µs/step/layer"), ("tflops", "TFLOP/s"), ("auto_rel_err", "rel. err"),
               ("tf32_ms", "TF32 ms"), ("tf32_speedup", "TF32 speed-up"), ("tf32_rel_err", "TF32 rel. err")]
CPU_COLUMNS = [("row", "row"), ("ours_ms", "ours ms"), ("onnxruntime_ms", "ONNX Runtime ms"), ("torch_ms", "PyTorch ms"),
               ("speedup_vs_ort", "× ORT"), ("speedup_vs_torch", "× PyTorch"), ("rel_err_vs_torch", "rel. err")]


MODEL_COLUMNS = [("row", "model"), ("ours_ms", "ours ms"), ("onnxruntime_ms", "ONNX Runtime ms"), ("pytorch_ms", "PyTorch ms"),
                 ("speedup_vs_ort", "× ORT"), ("speedup_vs_fastest", "× fastest other"), ("rel_err_vs_ort", "rel. err"),
                 ("compile_s", "compile s"), ("onnxruntime", "ONNX Runtime"), ("pytorch", "PyTorch"), ("error", "error")]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def markdown(results: list[dict], columns, env: dict, command: str) -> str:
    """The run's environment and its table, with only the columns some row has (the kinds asked for)."""
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    columns = [(k, h) for k, h in columns if any(r.get(k) not in (None, "") for r in results)]
    lines = [f"Run {env['date']} with `{command}`", "", "```", json.dumps(env, indent=1), "```", "",
             "| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(k, "")) for k, _ in columns) + " |" for r in results]
    return "\n".join(lines) + "\n"


def write_results(out_dir: str, stem: str, results, columns, env, command) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    js, md = os.path.join(out_dir, stem + ".json"), os.path.join(out_dir, stem + ".md")
    with open(js, "w") as f:
        json.dump({"environment": env, "command": command, "results": results}, f, indent=1)
    with open(md, "w") as f:
        f.write(markdown(results, columns, env, command))
    return js, md
