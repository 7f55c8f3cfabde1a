"""The `tvmrnn` command line: parsing only; each verb's work lives in tvmrnn.interface."""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import sys
import tempfile

import click

from .errors import InputError, UnsupportedModelError
from .interface import echo_wrapped
from .quiet import tvm_logs_filtered

# schedules.KERNEL_CHOICES and schedules.layer.PRECISIONS, spelled out so `--help` need not import TVM (tests/test_cli.py checks they agree)
KERNEL_CHOICES = ("auto", "stepwise", "persistent", "tiled", "mma", "persistent_mma", "cluster")
PRECISIONS = ("exact", "tf32")  # schedules.layer.PRECISIONS, likewise
# tvmrnn.bench.ROWS and CPU_ROWS by name, likewise (so `bench --help` lists them without importing the suite)
BENCH_ROWS = ("ds2-lstm", "ds2-gru", "ds2-5l-bi", "blog-a", "blog-b", "lat-b1-h512-l2", "lat-b1-h1024", "b8-h1024-l2",
              "b64-h1024-l2")
BENCH_STEP_ROWS = ("step-lstm-h64-b1", "step-gru-h64-b1", "step-lstm-h128-b1", "step-gru-h128-b1", "step-lstm-h256-b1",
                   "step-gru-h512-b1", "step-lstm-h512-b1", "step-lstm-h1024-b1", "step-gru-h1024-b1", "step-lstm-h1024-b8",
                   "step-lstm-h1024-b16", "step-gru-h1024-b16", "step-lstm-h1024-b64")
BENCH_CPU_ROWS = ("ds2-lstm", "ds2-gru", "lat-b1-h512-l2")


def _tvm_line_as_json(line: str) -> str:
    """A TVM log line as one of the server's JSON log lines (serve -v), so its log stays one JSON object per line."""
    return json.dumps({"level": "debug", "logger": "tvm", "msg": line})


def _our_errors() -> tuple:
    """The errors meant for people: ours, and the kernels' refusals (schedules.errors, not imported here: --help needs
    no TVM)."""
    kernels = sys.modules.get("schedules.errors")
    return (UnsupportedModelError, InputError) + ((kernels.KernelError,) if kernels else ())


def _gist(err: Exception) -> str:
    """An unexpected error's message in one line: its first, with the next where the first only announces it
    ("Compilation error:" before the linker's complaint)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
    gist = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return gist[:300]


def _for_people(json_logs: bool = False):
    """A command's output is for people: TVM's own log lines hidden (`-v` shows them; as JSON lines where the command
    logs JSON), our errors as one line and exit status 2, anything unexpected as one line and exit status 1 (`-v`:
    the traceback)."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*a, verbose=False, **kw):
            if verbose:
                os.environ["TVMRNN_VERBOSE"] = "1"  # for what reports below the CLI (tuning logs) and the server's workers
            quiet = tvm_logs_filtered(_tvm_line_as_json) if verbose and json_logs else \
                contextlib.nullcontext() if verbose else tvm_logs_filtered()
            with quiet:
                try:
                    return fn(*a, **kw)
                except _our_errors() as err:
                    status, message = 2, f"error: {err}"
                except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
                    raise
                except Exception as err:
                    if verbose:
                        raise
                    status, message = 1, f"error: {type(err).__name__}: {_gist(err)} (unexpected; rerun with -v for the traceback)"
                gc.collect()  # the failed import's objects go now, while TVM's farewells (BlockBuilder ...) are still hidden
            click.echo(message, err=True)
            sys.exit(status)

        return click.option("-v", "--verbose", is_flag=True,
                            help="show TVM's own log lines, and the traceback of an unexpected error")(wrapper)

    return decorate


def _writable_output(path: str) -> str:
    """-o's folder exists (created if need be) and takes files; else an InputError before any work is done."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise InputError(f"-o {path}: cannot create the folder {folder} ({err.strerror}); give a path you can write to") from None
    try:  # a file made and removed: os.access says yes to root where the file system still refuses (read-only, /sys)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise InputError(f"-o {path}: cannot write into the folder {folder} ({err.strerror}); give a path you can write to") from None
    return path


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
    bad = next((f"{k}={v}" for k, v in sizes.items() if not v.isdigit() or int(v) < 1), None)
    if bad:
        raise click.BadParameter(f"{bad!r}: a size is a positive integer", param_hint=what)
    return {k: int(v) for k, v in sizes.items()}


def _numbers(values, what, parse) -> dict:
    """NAME=V or NAME=V,V,... pairs (a list where there is a comma)."""
    try:
        return {k: [parse(x) for x in v.split(",")] if "," in v else parse(v) for k, v in _pairs(values, what).items()}
    except ValueError as err:
        raise click.BadParameter(f"{err}: values are numbers (a shape: N,N,...)", param_hint=what) from err


def _shapes(values, what) -> dict:
    """NAME=N (a dim's size) or NAME=N,N,... (an input's shape) pairs of positive sizes."""
    shapes = _numbers(values, what, int)
    sizes = {k: v if isinstance(v, list) else [v] for k, v in shapes.items()}
    bad = next((f"{k}={text}" for k, text in _pairs(values, what).items() if min(sizes[k]) < 1), None)
    if bad:
        raise click.BadParameter(f"{bad!r}: sizes are positive integers", param_hint=what)
    return shapes


def _specialization_options(fn):
    """--dim and --const, compile's and tune's alike: the model is specialized (frontend.prepare) before it is planned,
    so tune tunes the functions compile builds for these shapes."""
    fn = click.option("--const", "consts", multiple=True, metavar="INPUT=V", callback=lambda _c, _p, v: _numbers(v, "--const", float),
                      help="specialize the model for this value of an input, which leaves the module (--const sr=16000)")(fn)
    return click.option("--dim", "dims", multiple=True, metavar="NAME=N", callback=lambda _c, _p, v: _shapes(v, "--dim"),
                        help="fix a symbolic dim (--dim sequence=512) or an input's whole shape (--dim input=1,512)")(fn)


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
              help="tuning logs folder (default: $TVMRNN_TUNING_LOGS or ~/.cache/tvmrnn/tuning_logs, read with the logs "
                   "bundled with tvmrnn)")
@click.option("--tune", "tune_trials", default=0, metavar="TRIALS", help="tune with this many trials first, then compile")
@click.option("--time-budget", default=None, type=float, metavar="MIN", help="with --tune: stop tuning after this many minutes")
@click.option("--max-dim", "max_dims", multiple=True, metavar="DIM=N", callback=lambda _c, _p, v: _sizes(v, "--max-dim"),
              help="upper bound of an input's symbolic dim (repeat: --max-dim seq=512 --max-dim batch=64); larger inputs "
                   "are refused, and with every dim bounded a CUDA module replays each run as one CUDA graph")
@click.option("--cuda-graph/--no-cuda-graph", default=None,
              help="require / turn off the CUDA graph (default: on wherever every symbolic dim has a --max-dim)")
@_specialization_options
@_for_people()
def compile_cmd(model, output, target, kernel, dtype, precision, logs, tune_trials, time_budget, max_dims, cuda_graph, dims,
                consts):
    """Compile MODEL.onnx into a deployable module (applying matching tuning logs)."""
    from .interface.compile import CompileArgs, compile_command

    compile_command(CompileArgs(model, _writable_output(output), target, kernel, dtype, logs, tune_trials, time_budget,
                                precision, max_dims, cuda_graph, dims, consts), echo=echo_wrapped)



@main.command("tune")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--target", default=None, help="llvm, cuda, or a TVM target tag (default: cuda if a GPU is here, else llvm)")
@click.option("--trials", default=64, show_default=True, help="measured points in all tasks, counting those already logged (so a rerun resumes)")
@click.option("--logs", default=None, type=click.Path(file_okay=False),
              help="tuning logs folder to write (default: $TVMRNN_TUNING_LOGS or ~/.cache/tvmrnn/tuning_logs)")
@click.option("--time-budget", default=None, type=float, metavar="MIN", help="stop after this many minutes")
@click.option("--batch", "batches", multiple=True, type=int, help="a batch bucket to tune (repeatable; default: the model's batch, or 1, 8, 64)")
@click.option("--seq", default=None, type=int, help="steps per measurement (default: the model's, or 100)")
@click.option("--dtype", default=None, type=click.Choice(["float32", "float16", "bfloat16"]), help="as compile --dtype")
@click.option("--precision", default="exact", show_default=True, type=click.Choice(PRECISIONS), help="as compile --precision")
@click.option("--kernel", default="auto", show_default=True, type=click.Choice(KERNEL_CHOICES),
              help="restrict the CUDA kernel kinds searched")
@click.option("--graph-trials", default=None, type=int,
              help="measured points for the layers around the recurrent ones (convs, GEMMs, pooling; default: --trials; 0: none)")
@_specialization_options
@_for_people()
def tune_cmd(model, target, trials, logs, time_budget, batches, seq, dtype, precision, kernel, graph_trials, dims, consts):
    """Tune MODEL.onnx's recurrent kernels and the layers around them for TARGET with MetaSchedule; compile applies the logs."""
    from .interface.tune import TuneArgs, tune_command
    from .tuning.logs import default_logs_dir

    if trials < 1:
        raise click.BadParameter("must be at least 1", param_hint="--trials")
    tune_command(TuneArgs(model, target, trials, logs or str(default_logs_dir()), time_budget, tuple(batches), seq, dtype, kernel,
                          precision=precision, graph_trials=graph_trials, input_shapes=dims, consts=consts), echo=echo_wrapped)


@main.command("run")
@click.argument("module", type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="an input's value (repeatable)")
@click.option("--random", is_flag=True, help="draw the inputs not given with --input at random")
@click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE", help="size of a symbolic dim for random inputs (repeatable)")
@click.option("--seed", default=0, show_default=True)
@click.option("--output-dir", type=click.Path(file_okay=False), help="write each output as NAME.npy here")
@_for_people()
def run_cmd(module, inputs, random, dims, seed, output_dir):
    """Run a compiled MODULE (.so) once and print its outputs' shapes and checksums."""
    from .interface.run import RunArgs, run_command

    run_command(RunArgs(module, _pairs(inputs, "--input"), random, _sizes(dims, "--dim"), seed, output_dir), echo=echo_wrapped)


@main.command("inspect")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--target", default=None, help="for MODEL.onnx: show the kernels this target would get (default: what compile "
                                             "targets here: cuda if a GPU is here, else llvm)")
@_for_people()
def inspect_cmd(path, target):
    """List the recurrent layers of MODEL.onnx (and whether each is supported) or a compiled module's metadata."""
    from .interface.inspect import inspect_command

    sys.exit(1 if inspect_command(path, echo=echo_wrapped, target=target) else 0)


def _rows_epilog() -> str:
    """The rows, one group a paragraph that click prints as it is (\b): its wrapping would split names at hyphens."""
    groups = (("Rows (the GPU table's default):", BENCH_ROWS), ("Rows of the CPU table (--cpu):", BENCH_CPU_ROWS),
              ("Per-step rows (GPU, on request):", BENCH_STEP_ROWS))
    return "\n\n".join("\b\n" + title + "\n" + "\n".join(f"  {', '.join(rows[i:i + 4])}" for i in range(0, len(rows), 4))
                       for title, rows in groups)


@main.command("bench", epilog=_rows_epilog())
@click.option("--cpu", is_flag=True, help="the CPU table (ours on llvm vs ONNX Runtime and PyTorch) instead of the GPU one")
@click.option("--row", "rows", multiple=True, type=click.Choice(BENCH_ROWS + BENCH_STEP_ROWS), metavar="ROW",
              help="only this row (repeatable; the rows are listed below)")
@click.option("--repeats", default=20, show_default=True, help="timed runs per measurement (the median is reported)")
@click.option("--kernel", "kernels", multiple=True, default=("stepwise", "auto", "tuned"), show_default=True,
              type=click.Choice(KERNEL_CHOICES + ("tuned", "tf32")),
              help="our recurrent schedules to time on the GPU: untuned defaults (auto or one kind), auto with the tuning logs (tuned), auto with precision tf32 on the fp32 rows (tf32)")
@click.option("--dtype", "dtypes", multiple=True, default=("float32", "float16"), show_default=True,
              type=click.Choice(["float32", "float16"]), help="storage dtypes to time on the GPU")
@click.option("--model", "models", multiple=True, type=click.Path(dir_okay=False),
              help="whole ONNX models to time instead of the rows (repeatable): ours against ONNX Runtime on random inputs")
@click.option("--torch", "torch_factory", default=None, metavar="MODULE:FACTORY",
              help="with --model on the GPU: FACTORY(onnx_path) gives the torch module a file was exported from (None: "
                   "not known), timed as the PyTorch eager column (e.g. graph_cases:torch_net with tests/ on PYTHONPATH)")
@click.option("--out", "out_dir", default="benchmarks/results", show_default=True, type=click.Path(file_okay=False))
@_for_people()
def bench_cmd(cpu, rows, repeats, kernels, dtypes, models, torch_factory, out_dir):
    """Time our modules against cuDNN (GPU) or ONNX Runtime and PyTorch (--cpu), side by side in one run."""
    from .interface.bench import BenchArgs, bench_command

    bench_command(BenchArgs("cpu" if cpu else "gpu", tuple(rows), repeats, out_dir, tuple(kernels), tuple(dtypes),
                            tuple(models), torch_factory), echo=echo_wrapped)


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
@click.option("--isolation", default="auto", show_default=True, type=click.Choice(["auto", "process", "thread"]),
              help="process: each model runs in a worker process restarted if an input crashes it; thread: in the server's "
                   "process; auto: thread for GPU models without index inputs (token ids), process for the others")
@click.option("--http-workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="HTTP worker processes; more than 1 runs each model in an engine process that batches for all of them")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="TVM CPU threads per model worker (default: TVM's)")
@click.option("--device", default=None, type=click.Choice(["cpu", "cuda"]), help="run on this device (default: the module's target)")
@click.option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--graceful-timeout-s", default=30.0, show_default=True, help="on SIGTERM/SIGINT, how long in-flight requests get to finish")
@_for_people(json_logs=True)
def serve_cmd(modules, host, port, max_batch_size, max_delay_ms, max_request_bytes, sequence_idle_s, max_sequences, state,
              isolation, http_workers, threads, device, log_level, graceful_timeout_s):
    """Serve compiled MODULES (.so) over HTTP: the KServe/Triton v2 protocol, dynamic batching, streaming state, /metrics."""
    from .interface.serve import ServeArgs, serve_command

    serve_command(ServeArgs(tuple(modules), host, port, max_batch_size, max_delay_ms, max_request_bytes, sequence_idle_s,
                            max_sequences, tuple(state), isolation, device, log_level, graceful_timeout_s, threads=threads,
                            http_workers=http_workers), echo=echo_wrapped)


if __name__ == "__main__":
    main()
