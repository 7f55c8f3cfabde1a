"""`tvmrnn bench`: the benchmark suite, side by side with cuDNN (GPU) or ONNX Runtime and PyTorch (CPU)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .. import bench
from ..errors import InputError
from . import show_args


def _cuda_available() -> bool:
    """A GPU for both sides of the GPU table: TVM's CUDA runtime and torch's."""
    from ..build import gpu_present

    if not gpu_present():
        return False
    import torch

    return torch.cuda.is_available()


@dataclass
class BenchArgs:
    device: str  # "gpu" | "cpu"
    rows: tuple
    repeats: int
    out_dir: str
    kernels: tuple = ("stepwise", "auto")
    dtypes: tuple = ("float32", "float16")
    models: tuple = ()  # ONNX files timed whole instead of the rows
    torch_factory: str | None = None  # MODULE:FACTORY giving the torch module of a model file (the PyTorch eager column)


def bench_command(args: BenchArgs, echo=print) -> list[dict]:
    gpu = args.device == "gpu"
    if gpu and not _cuda_available():
        raise InputError("the GPU table times our CUDA modules against cuDNN or ONNX Runtime, and this host has no CUDA "
                         "GPU (or torch has no CUDA): run `tvmrnn bench --cpu" + (" --model ...`" if args.models else "`")
                         + " to time on the CPU")
    if args.models:
        return _bench_models(args, echo)
    known = {r.name: r for r in bench.ROWS + bench.STEP_ROWS}
    unknown = [r for r in args.rows if r not in known]
    if unknown:
        raise InputError(f"unknown benchmark row(s) {unknown}; rows are {list(known)}")
    echo(f"tvmrnn bench\n{show_args(args, skip=() if gpu else ('kernels', 'dtypes'))}")
    rows = [known[r] for r in (args.rows or ([r.name for r in bench.ROWS] if gpu else bench.CPU_ROWS))]
    jobs = [(row, dtype) for row in rows for dtype in (args.dtypes if gpu else ("float32",))]
    env = bench.environment(gpu)
    columns = bench.GPU_COLUMNS if gpu else bench.CPU_COLUMNS
    stem = f"{env['date'][:10]}-{'gpu' if gpu else 'cpu'}"
    results = []
    for i, (row, dtype) in enumerate(jobs, 1):
        echo(f"[{i}/{len(jobs)}] {row.name} {dtype}")
        try:
            res = bench.bench_gpu_row(row, args.kernels, args.repeats, dtype=dtype) if gpu else bench.bench_cpu_row(row, args.repeats)
            res = {k: v for k, v in res.items() if not k.startswith("_")}
        except Exception as err:  # one broken row must not lose the others' numbers
            res = {"row": row.name, "dtype": dtype, "error": f"{type(err).__name__}: {err}"}
        echo("    " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))
        results.append(res)
        # written after every row: a run cut short by a time limit keeps the rows it finished
        paths = bench.write_results(args.out_dir, stem, results, columns, env, " ".join(["tvmrnn"] + sys.argv[1:]))
    echo(bench.markdown(results, columns, env, "tvmrnn " + " ".join(sys.argv[1:])))
    echo(f"wrote {paths[0]} and {paths[1]}")
    return results


def _bench_models(args: BenchArgs, echo) -> list[dict]:
    gpu = args.device == "gpu"
    env = bench.environment(gpu)
    command = " ".join(["tvmrnn"] + sys.argv[1:])
    factory = bench.load_torch_factory(args.torch_factory) if args.torch_factory and gpu else None
    results = []
    for i, path in enumerate(args.models, 1):
        echo(f"[{i}/{len(args.models)}] {path}")
        try:
            res = bench.bench_model(path, "cuda" if gpu else "llvm", args.repeats, torch_factory=factory)
        except Exception as err:  # one broken model must not lose the others' numbers
            res = {"row": path, "error": f"{type(err).__name__}: {err}"}
        echo("    " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))
        results.append(res)
        paths = bench.write_results(args.out_dir, f"{env['date'][:10]}-{'gpu' if gpu else 'cpu'}-models", results,
                                    bench.MODEL_COLUMNS, env, command)
    echo(bench.markdown(results, bench.MODEL_COLUMNS, env, command))
    echo(f"wrote {paths[0]} and {paths[1]}")
    return results
