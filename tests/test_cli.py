"""The command line: compile, run, inspect on a bundled model, and clean errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import os

import numpy as np
from click.testing import CliRunner

from tvmrnn.cli import main

MODEL = os.path.join(os.path.dirname(__file__), "..", "models", "kws_gru.onnx")


def test_compile_run_inspect(tmp_path):
    runner = CliRunner()
    out = tmp_path / "kws.so"
    res = runner.invoke(main, ["compile", MODEL, "-o", str(out), "--target", "llvm"])
    assert res.exit_code == 0, res.output
    stages = ["[1/4] imported", "[2/4] planned 1 recurrent layer(s) for llvm", "[3/4] built for llvm", "[4/4] exported"]
    assert [res.output.find(s) for s in stages] == sorted(res.output.find(s) for s in stages) and all(s in res.output for s in stages)
    assert out.exists() and (tmp_path / "kws.json").exists()

    res = runner.invoke(main, ["run", str(out), "--random", "--dim", "batch=3", "--dim", "time=20", "--output-dir", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "keyword_logits" in res.output and "[3, 12]" in res.output
    assert np.load(tmp_path / "o" / "keyword_logits.npy").shape == (3, 12)

    np.save(tmp_path / "mfcc.npy", np.zeros((2, 7, 40), np.float32))
    res = runner.invoke(main, ["run", str(out), "--input", f"mfcc={tmp_path / 'mfcc.npy'}"])
    assert res.exit_code == 0 and "[2, 12]" in res.output, res.output

    res = runner.invoke(main, ["inspect", MODEL])
    assert res.exit_code == 0 and "GRU" in res.output and "supported" in res.output and "kernel: cuda: batch <= " in res.output and ": persistent(" in res.output
    res = runner.invoke(main, ["inspect", str(out)])
    assert res.exit_code == 0 and "kernel cpu" in res.output and "input projection CPU register-blocked" in res.output


def test_errors_exit_2_with_a_message(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["compile", str(tmp_path / "none.onnx"), "-o", str(tmp_path / "x.so")])
    assert res.exit_code == 2 and "does not exist" in res.output
    out = tmp_path / "kws.so"
    assert runner.invoke(main, ["compile", MODEL, "-o", str(out), "--target", "llvm"]).exit_code == 0
    res = runner.invoke(main, ["run", str(out)])
    assert res.exit_code == 2 and "--random" in res.output
    np.save(tmp_path / "bad.npy", np.zeros((2, 7, 41), np.float32))
    res = runner.invoke(main, ["run", str(out), "--input", f"mfcc={tmp_path / 'bad.npy'}"])
    assert res.exit_code == 2 and "axis 2 must be 40" in res.output
    res = runner.invoke(main, ["run", str(out), "--dim", "nonsense"])
    assert res.exit_code == 2 and "NAME=VALUE" in res.output
    res = runner.invoke(main, ["compile", MODEL, "-o", str(out), "--max-dim", "batch=many"])
    assert res.exit_code == 2 and "'batch=many': a size is a positive integer" in res.output
    res = runner.invoke(main, ["compile", MODEL, "-o", str(out), "--target", "llvm", "--max-dim", "frames=9"])
    assert res.exit_code == 2 and "max_dims names 'frames', which no input of the model has" in res.output


def test_compile_with_bounds_builds_a_cuda_graph(tmp_path):
    """Every symbolic dim bounded: the CUDA build (NVRTC, no GPU needed) replays its runs as a graph, and says so."""
    out = tmp_path / "kws.so"
    res = CliRunner().invoke(main, ["compile", MODEL, "-o", str(out), "--target", "cuda", "--max-dim", "batch=8", "--max-dim", "time=50"])
    assert res.exit_code == 0, res.output
    assert "CUDA graph on: batch <= 8, time <= 50" in res.output or "CUDA graph on: time <= 50, batch <= 8" in res.output
    meta = json.loads((tmp_path / "kws.json").read_text())
    assert meta["max_dims"] == {"batch": 8, "time": 50} and meta["cuda_graph"].startswith("on:")
    res = CliRunner().invoke(main, ["inspect", str(out)])
    assert res.exit_code == 0 and "CUDA graph on:" in res.output and ("bounds batch <= 8, time <= 50" in res.output or
                                                                      "bounds time <= 50, batch <= 8" in res.output)


def test_kernel_choices_match_the_schedules():
    """The CLI spells the kernel kinds out (so --help stays fast); they must be the ones the compiler accepts."""
    import schedules
    from tvmrnn import cli

    from schedules.layer import PRECISIONS

    assert cli.KERNEL_CHOICES == schedules.KERNEL_CHOICES
    assert cli.PRECISIONS == PRECISIONS
