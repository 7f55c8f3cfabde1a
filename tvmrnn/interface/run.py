"""`tvmrnn run`: load a compiled module, feed it .npy files or random inputs, print each output's shape and checksum."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..runtime import ModuleInputs, load_module


@dataclass
class RunArgs:
    module: str
    inputs: dict = field(default_factory=dict)  # input name -> .npy path
    random: bool = False
    dims: dict = field(default_factory=dict)  # symbolic dim -> size for random inputs
    seed: int = 0
    output_dir: str | None = None


DEFAULT_DIM = 8  # a symbolic dim nobody sized; small so the run is quick


def random_inputs(module: ModuleInputs, dims: dict, seed: int, given: dict) -> dict:
    """Random feeds for the inputs not in `given`: floats ~N(0,1), integers in [0, 10), sequence lengths = full length."""
    rng = np.random.default_rng(seed)
    sizes = {**dims}
    seq_lens = {sl.lens: (sl.x, sl.seq_axis) for sl in module.sequence_lens}
    for info in module.metadata["inputs"]:  # a given array fixes the symbolic dims it has
        if info["name"] in given:
            for d, n in zip(info["shape"], given[info["name"]].shape):
                if isinstance(d, str):
                    sizes.setdefault(d, n)
    shapes = {i["name"]: [d if isinstance(d, int) else sizes.setdefault(d, DEFAULT_DIM) for d in i["shape"]]
              for i in module.metadata["inputs"]}
    feeds = dict(given)
    for info in module.metadata["inputs"]:
        name, dtype, shape = info["name"], info["dtype"], shapes[info["name"]]
        if name in feeds:
            continue
        if name in seq_lens:
            x, axis = seq_lens[name]
            feeds[name] = np.full(shape, shapes[x][axis], dtype)
        elif np.issubdtype(np.dtype(dtype), np.integer):
            feeds[name] = rng.integers(0, 10, shape).astype(dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def run_command(args: RunArgs, echo=print) -> dict:
    module = load_module(args.module)
    given = {}
    for name, path in args.inputs.items():
        if not os.path.exists(path):
            raise InputError(f"--input {name}={path}: file does not exist")
        given[name] = np.load(path)
    missing = [n for n in module.input_names if n not in given]
    if missing and not args.random:
        raise InputError(f"no value for input(s) {missing}; pass --input NAME=FILE.npy or --random")
    feeds = random_inputs(module, args.dims, args.seed, given)
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
