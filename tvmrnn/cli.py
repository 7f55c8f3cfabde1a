"""The `tvmrnn` command line: parsing only; each verb's work lives in tvmrnn.interface."""

from __future__ import annotations

import sys

import click

from .errors import InputError, UnsupportedModelError

# schedules.KERNEL_CHOICES and schedules.layer.PRECISIONS, spelled out so `--help` need not import TVM (tests/test_cli.py checks they agree)
KERNEL_CHOICES = ("auto", "stepwise", "persistent", "tiled", "mma", "persistent_mma")
PRECISIONS = ("exact", "tf32")  # schedules.layer.PRECISIONS, likewise


def _fail_cleanly(fn):
    """Our errors are for people: print the message, exit 2, no traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except ValueError as err:
            kernels = sys.modules.get("schedules.errors")  # the kernels' refusals (not imported here: --help needs no TVM)
            if not isinstance(err, (UnsupportedModelError, InputError) + ((kernels.KernelError,) if kernels else ())):
                raise
            click.echo(f"error: {err}", err=True)
            sys.exit(2)

    return wrapper


def _pairs(values, what) -> dict:
    out = {}
    for v in values:
        if "=" not in v:
            raise click.BadParameter(f"{v!r} is not NAME=VALUE", param_hint=what)
        k, val = v.split("=", 1)
        out[k] = val
    return out


def _sizes(values, what) -> dict[str, int]:
    """NAME=N pairs of dim sizes."""
    sizes = _pairs(values, what)
    bad = next((f"{k}={v}" for k, v in sizes.items() if not v.isdigit()), None)
    if bad:
        raise click.BadParameter(f"{bad!r}: a size is a positive integer", param_hint=what)
    return {k: int(v) for k, v in sizes.items()}


@click.group()
@click.version_option(package_name="tvmrnn")
def main():
    """Compile ONNX models with LSTM/GRU/RNN layers into fast deployable TVM modules."""


@main.command("compile")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="the module to write (.so; its .json goes beside it)")
@click.option("--target", default=None, help="llvm, cuda, or a TVM target tag such as nvidia/nvidia-h100 (default: cuda if a GPU is here, else llvm)")
@click.option("--kernel", default="auto", show_default=True, type=click.Choice(KERNEL_CHOICES),
              help="the recurrent schedule on CUDA (auto: persistent at batch <= 4 and persistent_mma above where R fits on "
                   "chip; else per-step kernels: mma on tensor cores in half precision, stepwise or tiled in fp32)")
@click.option("--dtype", default=None, type=click.Choice(["float32", "float16", "bfloat16"]),
              help="storage of the recurrent layers (float16/bfloat16: half-precision weights, fp32 state)")
@click.option("--precision", default="exact", show_default=True, type=click.Choice(PRECISIONS),
              help="math of fp32 layers on CUDA: exact fp32, or tf32 (tensor cores, operands rounded to a 10-bit mantissa)")
@click.option("--logs", default=None, type=click.Path(file_okay=False),
              help="tuning logs folder (default: $TVMRNN_TUNING_LOGS or the checkout's tuning_logs/)")
@click.option("--tune", "tune_trials", default=0, metavar="TRIALS", help="tune with this many trials first, then compile")
@click.option("--time-budget", default=None, type=float, metavar="MIN", help="with --tune: stop tuning after this many minutes")
@click.option("--max-dim", "max_dims", multiple=True, metavar="DIM=N", callback=lambda _c, _p, v: _sizes(v, "--max-dim"),
              help="upper bound of an input's symbolic dim (repeat: --max-dim seq=512 --max-dim batch=64); larger inputs "
                   "are refused, and with every dim bounded a CUDA module replays each run as one CUDA graph")
@click.option("--cuda-graph/--no-cuda-graph", default=None,
              help="require / turn off the CUDA graph (default: on wherever every symbolic dim has a --max-dim)")
@_fail_cleanly
def compile_cmd(model, output, target, kernel, dtype, precision, logs, tune_trials, time_budget, max_dims, cuda_graph):
    """Compile MODEL.onnx into a deployable module (applying matching tuning logs)."""
    from .interface.compile import CompileArgs, compile_command

    compile_command(CompileArgs(model, output, target, kernel, dtype, logs, tune_trials, time_budget, precision, max_dims,
                                cuda_graph))



@main.command("tune")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--target", default=None, help="llvm, cuda, or a TVM target tag (default: cuda if a GPU is here, else llvm)")
@click.option("--trials", default=64, show_default=True, help="measured points in all tasks, counting those already logged (so a rerun resumes)")
@click.option("--logs", default=None, type=click.Path(file_okay=False),
              help="tuning logs folder (default: $TVMRNN_TUNING_LOGS or the checkout's tuning_logs/)")
@click.option("--time-budget", default=None, type=float, metavar="MIN", help="stop after this many minutes")
@click.option("--batch", "batches", multiple=True, type=int, help="a batch bucket to tune (repeatable; default: the model's batch, or 1, 8, 64)")
@click.option("--seq", default=None, type=int, help="steps per measurement (default: the model's, or 100)")
@click.option("--dtype", default=None, type=click.Choice(["float32", "float16", "bfloat16"]), help="as compile --dtype")
@click.option("--precision", default="exact", show_default=True, type=click.Choice(PRECISIONS), help="as compile --precision")
@click.option("--kernel", default="auto", show_default=True, type=click.Choice(KERNEL_CHOICES),
              help="restrict the CUDA kernel kinds searched")
@_fail_cleanly
def tune_cmd(model, target, trials, logs, time_budget, batches, seq, dtype, precision, kernel):
    """Tune MODEL.onnx's recurrent kernels for TARGET with MetaSchedule; compile applies the logs."""
    from .interface.tune import TuneArgs, tune_command
    from .tuning.logs import default_logs_dir

    if trials < 1:
        raise click.BadParameter("must be at least 1", param_hint="--trials")
    tune_command(TuneArgs(model, target, trials, logs or str(default_logs_dir()), time_budget, tuple(batches), seq, dtype, kernel,
                          precision=precision))


@main.command("run")
@click.argument("module", type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="an input's value (repeatable)")
@click.option("--random", is_flag=True, help="draw the inputs not given with --input at random")
@click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE", help="size of a symbolic dim for random inputs (repeatable)")
@click.option("--seed", default=0, show_default=True)
@click.option("--output-dir", type=click.Path(file_okay=False), help="write each output as NAME.npy here")
@_fail_cleanly
def run_cmd(module, inputs, random, dims, seed, output_dir):
    """Run a compiled MODULE (.so) once and print its outputs' shapes and checksums."""
    from .interface.run import RunArgs, run_command

    run_command(RunArgs(module, _pairs(inputs, "--input"), random, _sizes(dims, "--dim"), seed, output_dir))


@main.command("inspect")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--target", default="nvidia/nvidia-h100", show_default=True, help="for MODEL.onnx: show the kernels this target would get")
@_fail_cleanly
def inspect_cmd(path, target):
    """List the recurrent layers of MODEL.onnx (and whether each is supported) or a compiled module's metadata."""
    from .interface.inspect import inspect_command

    sys.exit(1 if inspect_command(path, target=target) else 0)


@main.command("bench")
@click.option("--cpu", is_flag=True, help="the CPU table (ours on llvm vs ONNX Runtime and PyTorch) instead of the GPU one")
@click.option("--row", "rows", multiple=True, help="only these rows (repeatable; default: all, or the CPU rows with --cpu)")
@click.option("--repeats", default=20, show_default=True, help="timed runs per measurement (the median is reported)")
@click.option("--kernel", "kernels", multiple=True, default=("stepwise", "auto", "tuned"), show_default=True,
              type=click.Choice(KERNEL_CHOICES + ("tuned", "tf32")),
              help="our recurrent schedules to time on the GPU: untuned defaults (auto or one kind), auto with the tuning logs (tuned), auto with precision tf32 on the fp32 rows (tf32)")
@click.option("--dtype", "dtypes", multiple=True, default=("float32", "float16"), show_default=True,
              type=click.Choice(["float32", "float16"]), help="storage dtypes to time on the GPU")
@click.option("--out", "out_dir", default="benchmarks/results", show_default=True, type=click.Path(file_okay=False))
@_fail_cleanly
def bench_cmd(cpu, rows, repeats, kernels, dtypes, out_dir):
    """Time our modules against cuDNN (GPU) or ONNX Runtime and PyTorch (--cpu), side by side in one run."""
    from .interface.bench import BenchArgs, bench_command

    bench_command(BenchArgs("cpu" if cpu else "gpu", tuple(rows), repeats, out_dir, tuple(kernels), tuple(dtypes)))


@main.command("serve")
@click.argument("modules", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="the address to listen on (0.0.0.0: every interface)")
@click.option("--port", default=8000, show_default=True, help="the TCP port (0: a free one, printed at start)")
@click.option("--max-batch-size", default=32, show_default=True, help="rows (batch-dim entries) per batch, requests of one model together")
@click.option("--max-delay-ms", default=5.0, show_default=True, help="how long the oldest queued request waits for others to join its batch")
@click.option("--max-request-bytes", default=64 * 2**20, show_default=True, help="larger request bodies (decompressed too) get 413")
@click.option("--sequence-idle-s", default=60.0, show_default=True, help="a streaming sequence idle for longer is dropped")
@click.option("--max-sequences", default=1024, show_default=True, help="live streaming sequences, all models together; more get 429")
@click.option("--state", "state", multiple=True, metavar="MODEL:INPUT=OUTPUT",
              help="a recurrent state pair of MODEL, replacing the NAME_in/NAME_out rule for it (repeatable)")
@click.option("--isolation", default="process", show_default=True, type=click.Choice(["process", "thread"]),
              help="process: each model runs in a worker process restarted if an input crashes it; thread: in the server")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="TVM CPU threads per model worker (default: TVM's)")
@click.option("--device", default=None, type=click.Choice(["cpu", "cuda"]), help="run on this device (default: the module's target)")
@click.option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--graceful-timeout-s", default=30.0, show_default=True, help="on SIGTERM/SIGINT, how long in-flight requests get to finish")
@_fail_cleanly
def serve_cmd(modules, host, port, max_batch_size, max_delay_ms, max_request_bytes, sequence_idle_s, max_sequences, state,
              isolation, threads, device, log_level, graceful_timeout_s):
    """Serve compiled MODULES (.so) over HTTP: the KServe/Triton v2 protocol, dynamic batching, streaming state, /metrics."""
    from .interface.serve import ServeArgs, serve_command

    serve_command(ServeArgs(tuple(modules), host, port, max_batch_size, max_delay_ms, max_request_bytes, sequence_idle_s,
                            max_sequences, tuple(state), isolation, device, log_level, graceful_timeout_s, threads=threads))


if __name__ == "__main__":
    main()
