"""The real-model zoo timed whole, side by side in one run: ours (untuned unless --logs) against ONNX Runtime and, on
a GPU, PyTorch eager where the model came from torch. Each model is compiled with the zoo's options and run on the
zoo's feeds (a streamed model: its chunks, each timed as one call).

    python benchmarks/zoo_bench.py [--target llvm|cuda] [--repeats N] [--out DIR] [--logs DIR|default] [--all] [NAME ...]

Without names: every model but the slow ones (ddddocr's 76 MB wheel); --all takes those too.

--logs compiles with tuning logs: a folder as `tvmrnn compile --logs` takes, or `default` for compile's own (the
user's folder and the repo's tuning_logs/); the table then says which.

ONNX Runtime uses its CUDA provider where the installed onnxruntime has one, else the row says so.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models import zoo  # noqa: E402
from models.zoo import g2p_en, keras_zoo, madmom, power_forecast, resemblyzer, silero_vad  # noqa: E402
from tvmrnn import bench  # noqa: E402


def _silero_jit():
    """The package's own TorchScript model (silero_vad.jit): a chunk of 512 samples and sr in, the speech probability
    out, its context and LSTM state kept inside (the ONNX files take them as inputs)."""
    import torch

    from models.zoo.fetch import package_dir

    data = package_dir(silero_vad.PACKAGE, silero_vad.VERSION) / "silero_vad" / "data"
    jit = torch.jit.load(str(data / "silero_vad.jit"))

    class Chunk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.jit = jit

        def forward(self, window, state, sr):
            return self.jit(window[:, silero_vad.CONTEXT:], int(sr))

    return Chunk()


TORCH_MODULES = {  # zoo name -> the eager module whose forward takes the ONNX inputs in order
    "silero_vad": _silero_jit, "silero_vad_16k_op15": _silero_jit, "silero_vad_op18_ifless": _silero_jit,
    "resemblyzer_legacy": resemblyzer.encoder, "resemblyzer_dynamo": resemblyzer.encoder,
    "g2p_en_legacy": g2p_en.seq2seq,
    "power_forecast": power_forecast.torch_module, "power_forecast_legacy": power_forecast.torch_module,
    "madmom_onsets_legacy": madmom.torch_module, "madmom_onsets_dynamo": madmom.torch_module,
}


def _torch_zoo_case(name, target):
    entry = zoo.MODELS[name]
    feeds = entry.feeds(np.random.default_rng(0))
    return entry.build(), feeds, entry.compile_options(target)


def _keras_zoo_case(name, target):
    return keras_zoo.build(name), [keras_zoo.example_inputs(name, 2, 12, seed=s) for s in range(2)], {}


def bench_zoo_model(name, target, repeats, logs=False) -> dict:
    case = _keras_zoo_case if name in keras_zoo.BY_NAME else _torch_zoo_case
    path, feeds, options = case(name, target)
    factory = (lambda _path: TORCH_MODULES[name]()) if name in TORCH_MODULES else None
    result = bench.bench_model(path, target, repeats, torch_factory=factory, feeds=feeds, options=options, logs=logs)
    return {**result, "row": name}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="zoo models (default: all but the slow ones)")
    parser.add_argument("--target", default="llvm", choices=["llvm", "cuda"])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--logs", help="compile with these tuning logs ('default': compile's own); untuned without")
    parser.add_argument("--all", action="store_true", help="without names: the slow models too")
    args = parser.parse_args()
    names = args.names or [n for n in zoo.MODELS if args.all or not zoo.MODELS[n].slow] + list(keras_zoo.BY_NAME)
    env, results = bench.environment(args.target == "cuda"), []
    logs = False if args.logs is None else None if args.logs == "default" else args.logs
    command = "python benchmarks/zoo_bench.py " + " ".join(sys.argv[1:])
    for i, name in enumerate(names, 1):
        try:
            res = bench_zoo_model(name, args.target, args.repeats, logs)
        except Exception as err:  # one broken model must not lose the others' numbers
            res = {"row": name, "error": f"{type(err).__name__}: {err}"}
        print(f"[{i}/{len(names)}] " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                 for k, v in res.items()), flush=True)
        results.append(res)
        bench.write_results(args.out, f"{'gpu' if args.target == 'cuda' else 'cpu'}-zoo-bench", results,
                            bench.MODEL_COLUMNS, env, command)
    print(bench.markdown(results, bench.MODEL_COLUMNS, env, command))


if __name__ == "__main__":
    main()
