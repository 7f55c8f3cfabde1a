"""The benchmark suite's CPU mode on a tiny row: ours, ONNX Runtime and PyTorch timed in interleaved rounds, our output
checked against PyTorch's first."""

import numpy as np

from tvmrnn import bench


def test_cpu_timing_takes_blocks_of_each_party_in_rounds():
    """Each round runs every party's block in turn: a warm-up run (the others' thread pools may still spin), then its
    timed runs on rotated inputs; rounds spread a drift in the machine's speed over all parties alike."""
    calls = []
    runs = {name: (lambda x, name=name: calls.append((name, int(x[0])))) for name in ("ours", "onnxruntime", "torch")}
    medians = bench._interleaved_median_ms(runs, [np.array([0]), np.array([1])], repeats=3, warmup=1, block=2)
    assert set(medians) == set(runs) and all(ms >= 0 for ms in medians.values())
    rounds = [[(n, i) for n in ("ours", "onnxruntime", "torch") for i in block] for block in ((0, 0, 1), (0, 0))]
    assert calls == [c for r in rounds for c in r]


def test_cpu_row_checks_ours_against_pytorch_and_times_all_three():
    row = bench.Row("tiny", "GRU", 6, 3, 8, 16, 1)
    res = bench.bench_cpu_row(row, repeats=3)
    assert res["rel_err_vs_torch"] < 1e-5
    assert all(res[f"{k}_ms"] > 0 for k in ("ours", "onnxruntime", "torch"))
    assert np.isclose(res["speedup_vs_ort"], res["onnxruntime_ms"] / res["ours_ms"])


def test_markdown_keeps_the_columns_some_row_has():
    """The table drops the kinds nobody asked for (a run of auto alone has no stepwise column), keeps a column one row
    fills, and writes what a row lacks as an empty cell."""
    rows = [{"row": "a", "dtype": "float32", "auto_ms": 1.5, "tf32_ms": 1.0}, {"row": "a", "dtype": "float16", "auto_ms": 0.25}]
    table = bench.markdown(rows, bench.GPU_COLUMNS, {"date": "today"}, "tvmrnn bench").splitlines()[-4:]
    assert table[0] == "| row | dtype | auto ms | TF32 ms |" and table[1] == "|---|---|---|---|"
    assert table[2:] == ["| a | float32 | 1.5 | 1 |", "| a | float16 | 0.25 |  |"]


def _ab_default():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "ab_default.py"
    spec = importlib.util.spec_from_file_location("ab_default", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ab_default_changes_the_rule_inside_its_block_only():
    """benchmarks/ab_default.py's change (a constant of schedules/, knobs on a kind's default points, or both) reaches
    auto's plan inside the block and is undone after it; a change or shape it cannot take is one line naming it."""
    import pytest
    import tvm

    from onnx_cases import Case
    from schedules import plan_kernel
    from schedules.cells import cell_for
    from schedules.space import default_config

    ab = _ab_default()
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    spec = Case(op="LSTM", hidden=256, input_size=8, dtype="float16").spec()
    first_kind = lambda: plan_kernel(spec, cell_for(spec), target).branches[0].config.kind  # noqa: E731
    k_warps = lambda: default_config("persistent_mma", spec, cell_for(spec), target, 1)["k_warps"]  # noqa: E731
    before = (first_kind(), k_warps())
    with ab.changed("choice.POLLED_MIN_HIDDEN=512"):
        assert first_kind() == "cluster"
    with ab.changed("persistent_mma:k_warps=4"):
        assert k_warps() == 4 != before[1]
    with ab.changed("choice.POLLED_MIN_HIDDEN=512+persistent_mma:k_warps=4"):
        assert (first_kind(), k_warps()) == ("cluster", 4)
    assert (first_kind(), k_warps()) == before == ("persistent_mma", 8)
    row, dtype = ab.parse_shape("gru-h1024-b16-bi-fp32")
    assert (row.cell, row.H, row.N, row.D, dtype) == ("GRU", 1024, 16, 2, "float32")
    for bad, says in (("choice.NO_SUCH=1", "MODULE.NAME=VALUE"), ("tiled:units=2", "KIND:KNOB=V takes a kind of"),
                      ("persistent_mma:k_warps=four", "whole-number values")):
        with pytest.raises(SystemExit, match=says), ab.changed(bad):
            pass
    with pytest.raises(SystemExit, match="expected CELL-hH-bB"):
        ab.parse_shape("lstm-384")
    assert ab.split_args(["persistent_mma:k_warps=4", "lstm-h384-b1", "persistent_mma:k_warps=2", "gru-h64-b16-bi"]) == (
        ["persistent_mma:k_warps=4", "persistent_mma:k_warps=2"], ["lstm-h384-b1", "gru-h64-b16-bi"])
    for bad, says in ((["persistent_mma:k_warps=4", "lstm-384"], "expected CELL-hH-bB"), (["lstm-h384-b1"], "CHANGE .CHANGE")):
        with pytest.raises(SystemExit, match=says):
            ab.split_args(bad)
    wide = Case(op="LSTM", hidden=320, input_size=8, dtype="float16").spec()  # ten chunks: 2 k-warps x 4 cannot hold A
    with pytest.raises(ab.DoesNotFit, match="LSTM H320: persistent_mma with {'k_warps': 2} does not fit"), ab.changed("persistent_mma:k_warps=2"):
        plan_kernel(wide, cell_for(wide), target)
