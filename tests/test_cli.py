"""The command line: compile, run, inspect on a bundled model, and clean errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

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

    res = runner.invoke(main, ["inspect", MODEL, "--target", "cuda"])
    assert res.exit_code == 0 and "GRU" in res.output and "supported" in res.output and "kernel: cuda: batch <= " in res.output and ": cluster(" in res.output
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


# --- a new user's first hour: every mistake is one line and a non-zero status, and the output is for people ---

REPO = os.path.join(os.path.dirname(__file__), "..")
TVM_LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ", re.M)


@pytest.fixture(scope="module")
def kws_llvm(tmp_path_factory):
    out = tmp_path_factory.mktemp("kws") / "kws.so"
    res = CliRunner().invoke(main, ["compile", MODEL, "-o", str(out), "--target", "llvm"])
    assert res.exit_code == 0, res.output
    return out


def _one_line_error(res, status, *words):
    assert res.exit_code == status, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    for w in words:
        assert w in errors[0], (w, errors[0])


@pytest.fixture
def cuda_module(kws_llvm, tmp_path):
    """A module whose metadata says CUDA sm_90a (loading stops at the metadata on a host without a GPU)."""
    if _gpu_present():
        pytest.skip("this host has a CUDA GPU")
    meta = json.loads(kws_llvm.with_suffix(".json").read_text())
    meta.update(target_kind="cuda", target=json.dumps({"kind": "cuda", "arch": "sm_90a"}))
    (tmp_path / "kws_cuda.json").write_text(json.dumps(meta))
    shutil.copy(kws_llvm, tmp_path / "kws_cuda.so")
    return tmp_path / "kws_cuda.so"


def _gpu_present():
    from tvmrnn.build import gpu_present

    return gpu_present()


def test_a_cuda_module_on_a_host_without_a_gpu_says_what_to_do(cuda_module):
    res = CliRunner().invoke(main, ["run", str(cuda_module), "--random"])
    _one_line_error(res, 2, "built for CUDA sm_90a; this host has no CUDA GPU: compile with --target llvm")
    for how in (["--isolation", "thread"], ["--isolation", "process"], ["--http-workers", "2"]):  # said before anything starts
        res = CliRunner().invoke(main, ["serve", str(cuda_module), "--port", "0", *how])
        _one_line_error(res, 2, "built for CUDA sm_90a; this host has no CUDA GPU: compile with --target llvm")
        assert "tvmrnn serve" not in res.output, res.output


def test_a_model_worker_reports_our_error_as_it_reads(cuda_module):
    """A model worker whose module will not load sends the server our message as it is (no class name before it)."""
    from multiprocessing import Pipe

    from tvmrnn.serve.workers import _worker_main

    ours, theirs = Pipe()
    _worker_main(str(cuda_module), None, theirs)
    kind, message = ours.recv()
    assert kind == "error" and message.startswith("this module was built for CUDA sm_90a; this host has no CUDA GPU"), message


def test_bench_without_cpu_on_a_cpu_host_points_at_cpu():
    if _gpu_present():
        pytest.skip("this host has a CUDA GPU")
    _one_line_error(CliRunner().invoke(main, ["bench", "--row", "ds2-gru"]), 2, "no CUDA GPU", "tvmrnn bench --cpu")
    _one_line_error(CliRunner().invoke(main, ["bench", "--model", MODEL]), 2, "no CUDA GPU", "tvmrnn bench --cpu --model")


def _string_model():
    g = helper.make_graph([helper.make_node("Cast", ["x"], ["s"], to=onnx.TensorProto.STRING)], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("s", onnx.TensorProto.STRING, [3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _relu_model():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _hidden_size_model():
    """hidden_size 5 while W holds 16 rows (an LSTM's 4 gates x 4)."""
    w = helper.make_tensor("W", onnx.TensorProto.FLOAT, [1, 16, 3], np.zeros(48, np.float32))
    r = helper.make_tensor("R", onnx.TensorProto.FLOAT, [1, 16, 4], np.zeros(64, np.float32))
    g = helper.make_graph([helper.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=5, name="enc")], "g",
                          [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["time", 1, 3])],
                          [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)], [w, r])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _bad_reshape_model():
    """A Reshape of 9 elements into 16: TVM's importer fails inside a block."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 3])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                          [helper.make_tensor("s", onnx.TensorProto.INT64, [2], [4, 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_bad_models_and_paths_are_one_line_errors(tmp_path):
    runner = CliRunner()
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    _one_line_error(runner.invoke(main, ["compile", str(empty), "-o", str(tmp_path / "e.so"), "--target", "llvm"]), 2,
                    "empty or not an ONNX model")
    _one_line_error(runner.invoke(main, ["inspect", str(empty)]), 2, "empty or not an ONNX model")
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a model")
    _one_line_error(runner.invoke(main, ["inspect", str(tmp_path / "junk.onnx")]), 2, "not a readable ONNX model")
    (tmp_path / "junk.so").write_bytes(b"x")
    (tmp_path / "junk.json").write_text('{"format": 1')
    _one_line_error(runner.invoke(main, ["inspect", str(tmp_path / "junk.so")]), 2, "junk.json' is not readable tvmrnn module metadata")
    onnx.save(_string_model(), tmp_path / "text.onnx")
    _one_line_error(runner.invoke(main, ["compile", str(tmp_path / "text.onnx"), "-o", str(tmp_path / "t.so"), "--target", "llvm"]),
                    2, "tensor 's' holds strings", "numeric tensors only")
    onnx.save(_hidden_size_model(), tmp_path / "hidden.onnx")
    _one_line_error(runner.invoke(main, ["compile", str(tmp_path / "hidden.onnx"), "-o", str(tmp_path / "h.so"), "--target", "llvm"]),
                    2, "LSTM node 'enc'", "hidden_size is 5 while W holds 16 rows (4 x 4)")
    (tmp_path / "a_file").write_text("")
    _one_line_error(runner.invoke(main, ["compile", MODEL, "-o", str(tmp_path / "a_file" / "m.so"), "--target", "llvm"]), 2,
                    "-o ", "cannot create the folder", "give a path you can write to")
    # a folder that exists and refuses files even to root (os.access says yes there): refused before the compile
    _one_line_error(runner.invoke(main, ["compile", MODEL, "-o", "/proc/m.so", "--target", "llvm"]), 2,
                    "-o /proc/m.so: cannot write into the folder /proc", "give a path you can write to")
    onnx.save(_relu_model(), tmp_path / "relu.onnx")
    _one_line_error(runner.invoke(main, ["tune", str(tmp_path / "relu.onnx"), "--target", "llvm", "--trials", "2",
                                         "--logs", str(tmp_path / "logs")]), 2, "no LSTM, GRU or RNN layer", "nothing to tune")
    for verb in ("serve", "run"):
        _one_line_error(runner.invoke(main, [verb, MODEL]), 2, "is an ONNX model; compile it first", "tvmrnn compile")


def test_run_says_the_dims_it_picked_and_refuses_a_zero(kws_llvm):
    runner = CliRunner()
    res = runner.invoke(main, ["run", str(kws_llvm), "--random", "--dim", "batch=2"])
    assert res.exit_code == 0, res.output
    assert "batch=2" in res.output and "time=8 (default; set with --dim)" in res.output and "[2, 8, 40]" in res.output
    res = runner.invoke(main, ["run", str(kws_llvm), "--random", "--dim", "batch=0"])
    assert res.exit_code == 2 and "'batch=0': a size is a positive integer" in res.output
    for dim in ("batch=0", "mfcc=0,5,40"):  # compile's --dim too, a dim's size or an input's shape, refused as given
        res = runner.invoke(main, ["compile", MODEL, "-o", str(kws_llvm.parent / "z.so"), "--target", "llvm", "--dim", dim])
        assert res.exit_code == 2 and f"--dim: '{dim}': sizes are positive integers" in res.output, res.output
    _one_line_error(runner.invoke(main, ["run", str(kws_llvm), "--random", "--dim", "frames=3"]), 2,
                    "--dim frames", "['batch', 'time']")


def test_run_names_a_wrong_input_before_its_size(kws_llvm, tmp_path):
    np.save(tmp_path / "three.npy", np.zeros(3, np.float32))  # a wrong name and a wrong element count: the name is said
    for extra in ([], ["--random"]):
        _one_line_error(CliRunner().invoke(main, ["run", str(kws_llvm), "--input", f"features={tmp_path / 'three.npy'}", *extra]),
                        2, "--input features: the module has no input of that name", "['mfcc']")
    _one_line_error(CliRunner().invoke(main, ["run", str(kws_llvm), "--input", f"mfcc={MODEL}"]), 2, "not a NumPy .npy file")


def test_output_reads_as_key_value_lines_within_120_columns(kws_llvm, tmp_path):
    runner = CliRunner()
    outputs = [runner.invoke(main, ["compile", MODEL, "-o", str(tmp_path / "k.so"), "--target", "cuda"]),
               runner.invoke(main, ["inspect", MODEL, "--target", "cuda"]), runner.invoke(main, ["inspect", str(kws_llvm)]),
               runner.invoke(main, ["run", str(kws_llvm), "--random"])]
    for res in outputs:
        assert res.exit_code == 0, res.output
        assert max(len(line) for line in res.output.splitlines()) <= 120, res.output
        assert " None" not in res.output and "Args(" not in res.output and "Row(" not in res.output, res.output
    assert "  target: cuda sm_90a\n" in outputs[0].output and "  dtype: the model's\n" in outputs[0].output
    assert "tvmrnn module for llvm " in outputs[2].output


def test_inspect_targets_what_compile_would_here():
    res = CliRunner().invoke(main, ["inspect", MODEL])
    assert res.exit_code == 0, res.output
    here = "cuda" if _gpu_present() else "llvm"
    assert f"kernels as chosen for {here}" in res.output and f"kernel: {'cuda' if here == 'cuda' else 'cpu'}: " in res.output


def test_bench_prints_its_arguments_and_rows_for_people(monkeypatch, tmp_path):
    """bench --cpu's output (the row's timing stubbed: its numbers are tests/test_bench.py's): key: value lines, a
    row's results as key=value, no dataclass reprs, no line over 120 columns."""
    from tvmrnn import bench

    monkeypatch.setattr(bench, "bench_cpu_row", lambda row, repeats: {"row": row.name, "dtype": "float32", "ours_ms": 1.5,
                                                                      "onnxruntime_ms": 2.0, "speedup_vs_ort": 4 / 3})
    res = CliRunner().invoke(main, ["bench", "--cpu", "--row", "ds2-gru", "--repeats", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "tvmrnn bench\n  device: cpu\n  rows: ds2-gru\n  repeats: 1\n" in res.output, res.output
    assert "    row=ds2-gru, dtype=float32, ours_ms=1.5, onnxruntime_ms=2, speedup_vs_ort=1.333" in res.output, res.output
    assert max(len(line) for line in res.output.splitlines()) <= 120, res.output
    assert " None" not in res.output and "Args(" not in res.output and "Row(" not in res.output, res.output


def test_an_unexpected_error_says_its_gist_in_one_line():
    from tvmrnn.cli import _gist

    linker = RuntimeError("Compilation error:\n/usr/bin/ld: cannot open output file /x.so: Permission denied\n"
                          "collect2: error: ld returned 1 exit status\n\nCommand line: /usr/bin/g++ -shared")
    assert _gist(linker) == "Compilation error: /usr/bin/ld: cannot open output file /x.so: Permission denied"
    assert _gist(ValueError("bad\nsecond")) == "bad" and _gist(KeyError()) == ""


def test_bench_help_lists_its_rows():
    from tvmrnn import bench, cli

    res = CliRunner().invoke(main, ["bench", "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert all(row.name in text for row in bench.ROWS + bench.STEP_ROWS), res.output
    assert cli.BENCH_ROWS == tuple(r.name for r in bench.ROWS) and cli.BENCH_CPU_ROWS == bench.CPU_ROWS
    assert cli.BENCH_STEP_ROWS == tuple(r.name for r in bench.STEP_ROWS)


def _tvmrnn(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": os.path.abspath(REPO)}
    return subprocess.run([sys.executable, "-m", "tvmrnn", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_no_tvm_log_lines_without_v(tmp_path):
    """compile, run, inspect and serve in their own processes (TVM logs from C++, on file descriptor 2): none of TVM's
    lines without -v; with -v they show (serve's as JSON lines)."""
    out = tmp_path / "kws.so"
    runs = [_tvmrnn("compile", MODEL, "-o", str(out), "--target", "llvm")]
    runs += [_tvmrnn("run", str(out), "--random"), _tvmrnn("inspect", MODEL)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
        assert not TVM_LOG_LINE.search(proc.stdout + proc.stderr), proc.stdout + proc.stderr
    loud = _tvmrnn("run", str(out), "--random", "-v")
    assert loud.returncode == 0 and "Scope Loaded" in loud.stderr, loud.stderr
    onnx.save(_bad_reshape_model(), tmp_path / "reshape.onnx")  # an import error: TVM's BlockBuilder complains on its way out
    for flags in ([], ["-v"]):
        proc = _tvmrnn("compile", str(tmp_path / "reshape.onnx"), "-o", str(tmp_path / "r.so"), "--target", "llvm", *flags)
        assert proc.returncode == 2 and "error: an unnamed Reshape node: " in proc.stderr, proc.stderr
        assert ("BlockBuilder destroyed" in proc.stderr) == bool(flags), proc.stderr
        assert bool(TVM_LOG_LINE.search(proc.stdout + proc.stderr)) == bool(flags), proc.stderr
    for flags in ([], ["-v"]):
        proc = subprocess.Popen([sys.executable, "-m", "tvmrnn", "serve", str(out), "--port", "0", *flags], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": os.path.abspath(REPO)})
        try:
            assert any("serving ['kws']" in line for line in proc.stdout), proc.stderr.read()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        err = proc.stderr.read()
        assert not TVM_LOG_LINE.search(err), err
        assert all(json.loads(line) for line in err.splitlines() if line.strip()), err  # JSON lines, TVM's too at -v
        assert ('"logger": "tvm"' in err) == bool(flags), err


def test_pytest_q_shows_progress():
    """The README's `pytest -q` shows where a run of minutes is: the share done, and in one process each file's name."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "tests/test_cli.py", "-k",
                           "kernel_choices_match"], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": os.path.abspath(REPO)})
    assert proc.returncode == 0 and re.search(r"^tests/test_cli.py \. +\[100%\]$", proc.stdout, re.M), proc.stdout + proc.stderr
