"""`tvmrnn run`: load a compiled module, feed it .npy files or random inputs, print each output's shape and checksum."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..runtime import load_module, random_inputs


@dataclass
class RunArgs:
    module: str
    inputs: dict = field(default_factory=dict)  # input name -> .npy path
    random: bool = False
    dims: dict = field(default_factory=dict)  # symbolic dim -> size for random inputs
    seed: int = 0
    output_dir: str | None = None


def symbolic_dims(module) -> list[str]:
    """The inputs' symbolic dims, in order of first appearance."""
    return list(dict.fromkeys(d for i in module.metadata["inputs"] for d in i["shape"] if isinstance(d, str)))


def run_command(args: RunArgs, echo=print) -> dict:
    module = load_module(args.module)
    unknown = [n for n in args.inputs if n not in module.input_names]
    if unknown:
        raise InputError(f"--input {unknown[0]}: the module has no input of that name; its inputs are {module.input_names}")
    given = {}
    for name, path in args.inputs.items():
        if not os.path.exists(path):
            raise InputError(f"--input {name}={path}: file does not exist")
        try:
            given[name] = np.load(path)
        except (OSError, ValueError, EOFError):
            raise InputError(f"--input {name}={path}: not a NumPy .npy file; save the array with numpy.save") from None
    missing = [n for n in module.input_names if n not in given]
    if missing and not args.random:
        raise InputError(f"no value for input(s) {missing}; pass --input NAME=FILE.npy or --random")
    unknown = sorted(set(args.dims) - set(symbolic_dims(module)))
    if unknown:
        raise InputError(f"--dim {unknown[0]}: the module has no symbolic dim of that name; its dims are "
                         f"{symbolic_dims(module) or 'all static'}")
    sizes = dict(args.dims)
    feeds = random_inputs(module, sizes, args.seed, given)
    if sizes:
        picked = [f"{d}={n}" + ("" if d in args.dims else " (default; set with --dim)") for d, n in sizes.items()]
        echo("dims   " + ", ".join(picked))
    for name, value in feeds.items():
        echo(f"input  {name:<16} {str(value.dtype):<8} {list(value.shape)}")
    outs = module.run(feeds)
    for name, value in outs.items():
        echo(f"output {name:<16} {str(value.dtype):<8} {list(value.shape)}  sum {float(value.astype(np.float64).sum()):.6g}"
             f"  mean|x| {float(np.abs(value).mean()):.6g}")
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            np.save(os.path.join(args.output_dir, f"{name}.npy"), value)
    if args.output_dir:
        echo(f"wrote {len(outs)} output(s) to {args.output_dir}")
    return outs
