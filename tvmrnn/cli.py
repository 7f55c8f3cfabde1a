"""The `tvmrnn` command line: parsing only; each verb's work lives in tvmrnn.interface."""

from __future__ import annotations

import sys

import click

from .errors import InputError, UnsupportedModelError


def _fail_cleanly(fn):
    """Our errors are for people: print the message, exit 2, no traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except (UnsupportedModelError, InputError) as err:
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


@click.group()
@click.version_option(package_name="tvmrnn")
def main():
    """Compile ONNX models with LSTM/GRU/RNN layers into fast deployable TVM modules."""


@main.command("compile")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="the module to write (.so; its .json goes beside it)")
@click.option("--target", default=None, help="llvm, cuda, or a TVM target tag such as nvidia/nvidia-h100 (default: cuda if a GPU is here, else llvm)")
@click.option("--kernel", default="auto", show_default=True, type=click.Choice(["auto", "stepwise", "persistent"]),
              help="the recurrent schedule on CUDA (auto: persistent where R fits on chip and the batch is small)")
@_fail_cleanly
def compile_cmd(model, output, target, kernel):
    """Compile MODEL.onnx into a deployable module."""
    from .interface.compile import compile_command

    compile_command(model, output, target, kernel)


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

    sizes = {k: int(v) for k, v in _pairs(dims, "--dim").items()}
    run_command(RunArgs(module, _pairs(inputs, "--input"), random, sizes, seed, output_dir))


@main.command("inspect")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@_fail_cleanly
def inspect_cmd(path):
    """List the recurrent layers of MODEL.onnx (and whether each is supported) or a compiled module's metadata."""
    from .interface.inspect import inspect_command

    sys.exit(1 if inspect_command(path) else 0)


@main.command("bench")
@click.option("--cpu", is_flag=True, help="the CPU table (ours on llvm vs ONNX Runtime and PyTorch) instead of the GPU one")
@click.option("--row", "rows", multiple=True, help="only these rows (repeatable; default: all, or the CPU rows with --cpu)")
@click.option("--repeats", default=20, show_default=True, help="timed runs per measurement (the median is reported)")
@click.option("--kernel", "kernels", multiple=True, default=("stepwise", "auto"), show_default=True,
              help="our recurrent schedules to time on the GPU (auto, stepwise, persistent)")
@click.option("--dtype", "dtypes", multiple=True, default=("float32", "float16"), show_default=True,
              type=click.Choice(["float32", "float16"]), help="storage dtypes to time on the GPU")
@click.option("--out", "out_dir", default="benchmarks/results", show_default=True, type=click.Path(file_okay=False))
@_fail_cleanly
def bench_cmd(cpu, rows, repeats, kernels, dtypes, out_dir):
    """Time our modules against cuDNN (GPU) or ONNX Runtime and PyTorch (--cpu), side by side in one run."""
    from .interface.bench import BenchArgs, bench_command

    bench_command(BenchArgs("cpu" if cpu else "gpu", tuple(rows), repeats, out_dir, tuple(kernels), tuple(dtypes)))


if __name__ == "__main__":
    main()
