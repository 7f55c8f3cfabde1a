"""Tuning on the LLVM target: a short MetaSchedule run writes a database, compile applies it, bad logs are refused.

One short tune (a few trials of a small layer) serves every test here: the first MetaSchedule
import alone costs tens of seconds on a CI machine.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnx_cases import Case
import tvmrnn
from tvmrnn.build import resolve_target
from tvmrnn.cli import main
from tvmrnn.tuning.logs import TuningLogs, target_name

CASE = Case(op="LSTM", hidden=32, input_size=8, optional=("B", "sequence_lens"))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    model = root / "small.onnx"
    onnx.save(CASE.model(), model)
    logs = root / "logs"
    res = CliRunner().invoke(main, ["tune", str(model), "--target", "llvm", "--trials", "6", "--batch", "1", "--batch", "4",
                                    "--seq", "20", "--graph-trials", "0", "--logs", str(logs)])
    assert res.exit_code == 0, res.output  # the graph's own tasks: tests/test_graph_ops.py
    return model, logs, res.output


@pytest.mark.slow  # the tuned fixture tunes for minutes on 2 cores
def test_tune_writes_a_database(tuned):
    _, logs, output = tuned
    folder = logs / target_name(resolve_target("llvm"))
    records = (folder / "database_tuning_record.json").read_text().splitlines()
    assert len(records) >= 6 and len((folder / "database_workload.json").read_text().splitlines()) == 2
    run = json.loads((folder / "runs.jsonl").read_text().splitlines()[-1])
    assert run["trials_run"] == len(records) and set(run["best"]) == {"LSTM-h32-i8-for-float32-b1-s20", "LSTM-h32-i8-for-float32-b4-s20"}
    assert "[1/3] 2 task(s)" in output and "[3/3] done" in output and "best" in output
    # one count throughout: each round's line counts on from the default points to the summary's number, the summary's
    # add up to --trials, and no line calls a point slower than the default the best
    rounds, summary = output.split("[3/3] done")
    final = {name: int(n) for name, n in re.findall(r"\[\d/2\] (\S+): (\d+) trials", summary)}
    assert sum(final.values()) == 6 == len(records), output
    for name, last in final.items():
        counts = [int(n) for n in re.findall(rf"\[\d/2\] {re.escape(name)}: (\d+) trials", rounds)]
        assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == last, (name, counts, last)
    assert "kernel alone: 0." not in output, output


@pytest.mark.slow  # the tuned fixture tunes for minutes on 2 cores
def test_compile_applies_the_logs_and_stays_correct(tuned, tmp_path):
    model, logs, _ = tuned
    # the logs without tune's whole-module verdicts (a bucket the default won would run the default: tested below)
    logs = shutil.copytree(logs, tmp_path / "logs")
    (logs / target_name(resolve_target("llvm")) / "verdicts.jsonl").unlink()
    res = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "m.so"), "--target", "llvm", "--logs", str(logs)])
    assert res.exit_code == 0, res.output
    assert "lstm_node: tuned for batch buckets [1, 4]" in res.output and "[tuned" in res.output
    meta = json.loads((tmp_path / "m.json").read_text())
    layer = meta["layers"][0]
    assert layer["tuned"] and [(b["up_to_batch"], b["tuned"]) for b in layer["schedule"]] == [(1, True), (2, False), (3, False), (4, True), (None, False)]
    # the tuned module computes what the untuned one does, at batch sizes on both sides of the buckets
    tuned_mod = tvmrnn.load(str(tmp_path / "m.so"))
    plain = tvmrnn.compile(str(model), target="llvm", logs=False)
    assert not plain.metadata["layers"][0]["tuned"]
    rng = np.random.default_rng(3)
    for n in (1, 3, 6):
        feeds = CASE.feeds(rng, 11, n)
        want = CASE.reference(feeds)
        for mod in (tuned_mod, plain):
            got = mod.run(feeds)
            for name, ref in want.items():
                np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # the tuned fixture tunes for minutes on 2 cores
def test_damaged_log_is_reported_and_skipped(tuned, tmp_path):
    model, logs, _ = tuned
    bad = tmp_path / "logs"
    shutil.copytree(logs, bad)
    folder = bad / target_name(resolve_target("llvm"))
    with open(folder / "database_tuning_record.json", "a") as f:
        f.write("{not json\n")
    res = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "m.so"), "--target", "llvm", "--logs", str(bad)])
    assert res.exit_code == 0, res.output
    assert "is not JSON" in res.output and "skipped" in res.output and "default schedule" in res.output
    # tuning would append to it: refused with the file named, no traceback
    res = CliRunner().invoke(main, ["tune", str(model), "--target", "llvm", "--trials", "1", "--logs", str(bad)])
    assert res.exit_code == 2 and "damaged" in res.output and "database_tuning_record.json" in res.output


@pytest.mark.slow  # the tuned fixture tunes for minutes on 2 cores
def test_foreign_log_is_reported_and_skipped(tuned, tmp_path):
    _, logs, _ = tuned
    here = resolve_target("llvm")
    other = tvmrnn.build.tvm.target.Target({"kind": "llvm", "mcpu": "x86-64" if here.attrs.get("mcpu") != "x86-64" else "skylake"})
    shutil.copytree(logs / target_name(here), tmp_path / target_name(other))
    found = TuningLogs.load(tmp_path, other)
    assert found.records == 0 and any("skipped" in p and target_name(here) in p for p in found.problems)


@pytest.mark.slow  # the tuned fixture tunes for minutes on 2 cores
def test_log_of_a_changed_kernel_is_reported_and_skipped(tuned, monkeypatch):
    """Records timed on a kernel whose arguments have changed since (here R's layout: panels, as the small layer was
    tuned, against R^T) are skipped and reported, not mixed with today's times: a layer's key names its shape only."""
    from schedules import recurrent_cpu

    _, logs, _ = tuned
    assert TuningLogs.load(logs, resolve_target("llvm")).records >= 6
    monkeypatch.setattr(recurrent_cpu, "r_layout", lambda spec: "transposed")
    found = TuningLogs.load(logs, resolve_target("llvm"))
    assert found.records == 0 and any("timed on kernels whose arguments have changed" in p for p in found.problems), found.problems


def test_tuned_point_needs_the_default_measured_beside_it():
    """A logged point replaces the default only when the same logs timed the default and it beat it by TUNED_MARGIN;
    logs that never timed today's default (older than a kernel kind) leave the default in place."""
    import tvm

    from schedules import TUNED_MARGIN, plan_kernel
    from schedules.cells import cell_for
    from schedules.space import KernelConfig, default_config

    spec = CASE.spec()
    cell, target = cell_for(spec), tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    default = plan_kernel(spec, cell, target).branches[-1].config  # what batch 64 runs untuned
    other = KernelConfig.of("stepwise", warps=8, units_per_warp=2, batch_tile=4)
    assert other != default and default == default_config(default.kind, spec, cell, target)

    def picked(points):
        plan = plan_kernel(spec, cell, target, tuned={64: points})
        return next(b for b in plan.branches if b.up_to is None or b.up_to >= 64)

    assert not picked([(other, 1.0)]).tuned  # the default never measured: kept
    assert picked([(other, 1.0), (default, 1.0 / (1 - TUNED_MARGIN) + 0.01)]).config == other  # clearly faster: taken
    kept = picked([(other, 1.0), (default, 1.01)])  # within the margin: the default stays, and says why
    assert kept.config == default and kept.tuned and kept.kept_default and kept.label == "tuned: default kept"
    assert not picked([(other, 1.0), (default, 2.0)]).kept_default


def test_tuned_bucket_leaves_smaller_batches_their_default():
    """A tuned bucket runs from the boundary below it: where only bucket 8 is usable (lat-b1-h1024's layer, tuned at batch
    8 for b8-h1024-l2), batches 1-4 keep the default cluster and persistent kernels rather than run bucket 8's point."""
    import tvm

    from schedules import plan_kernel
    from schedules.cells import cell_for
    from schedules.space import KernelConfig

    spec = Case(op="LSTM", hidden=1024, input_size=1024).spec()
    cell, target = cell_for(spec), tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    untuned = plan_kernel(spec, cell, target)
    default8 = next(b.config for b in untuned.branches if b.up_to is not None and b.up_to >= 8)
    faster8 = KernelConfig.of("persistent_mma", **{**dict(default8.knobs), "depth": 1})
    plan = plan_kernel(spec, cell, target, tuned={8: [(faster8, 1.0), (default8, 2.0)]})
    got = [(b.up_to, b.config.kind, b.tuned) for b in plan.branches]
    assert got[:3] == [(1, "cluster", False), (4, "persistent", False), (8, "persistent_mma", True)], got
    assert plan.branches[2].config == faster8 and plan.branches[3:] == untuned.branches[3:]


def test_every_cuda_default_is_a_point_of_its_space_trace():
    """What the tuner does first on a GPU, without one: each CUDA design space of a batch-1 layer (persistent among
    them, whose default leaves its later knob prefetch unnamed) replays the kind's default point as decisions (or, for a
    default outside the space, as fixed annotations), and the schedule reads back as that default. The spaces come from
    the tuner's space generator on the task's workload, as its TuneContext asks for them (creating a TuneContext
    imports all of TVM's tensor intrinsics: minutes on 2 cores)."""
    import tvm
    from tvm.s_tir import Schedule

    from schedules.space import default_config, in_space
    from tvmrnn.tuning import search
    from tvmrnn.tuning.tasks import RecurrentTask

    spec = Case(op="LSTM", hidden=64, input_size=8).spec()
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    task = RecurrentTask(spec, seq=10, batch=1)
    workload = task.template(target)
    kinds = []
    for space in search.design_spaces(task, target).generate_design_space(workload):
        kind = search.config_of(space.mod).kind
        point = default_config(kind, task.spec, task.cell, target, 1)
        if in_space(point, task.spec, task.cell, target):
            sch = Schedule(workload)
            search.point_trace(space, point).apply_to_schedule(sch, remove_postproc=True)
        else:  # exact fp32's persistent_mma at batch <= 8 splits the reduction 16 ways, which the product space cannot hold
            assert kind == "persistent_mma", kind
            sch = search.fixed_point(workload, point)
        assert search.config_of(sch.mod) == point, kind
        kinds.append(kind)
    assert "persistent" in kinds and "persistent_mma" in kinds, kinds


def test_default_outside_the_space_is_logged_and_read_back(tmp_path):
    """persistent_mma's default for a bidirectional H=800 fp32 layer lies outside its space (only n_tiles=1 fits every way),
    so the search cannot reach it; the tuner logs it as fixed annotations, and the logs read it back as that default, so a
    tuned point can be weighed against it (without it, compile kept the default for the bucket whatever the tuning found)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from schedules import plan_kernel
    from schedules.cells import cell_for
    from schedules.space import default_config, in_space
    from tvmrnn.tuning import search
    from tvmrnn.tuning.logs import open_database, target_dir
    from tvmrnn.tuning.tasks import RecurrentTask

    case = Case(op="LSTM", hidden=800, input_size=8, direction="bidirectional")
    spec = case.spec()
    cell, target = cell_for(spec), tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    task = RecurrentTask(spec, seq=10, batch=20)
    default = default_config("persistent_mma", spec, cell, target, 20)
    assert not in_space(default, spec, cell, target)
    assert next(b for b in plan_kernel(spec, cell, target).branches if b.up_to is None or b.up_to >= 20).config == default
    tuned = search.fixed_point(task.template(target), default)
    tuned_point = default.__class__.of("persistent_mma", **{**dict(default.knobs), "n_tiles": 1, "n_warps": 1, "k_warps": 8})
    assert search.config_of(tuned.mod) == default
    db = open_database(target_dir(tmp_path, target))
    for point, secs in ((default, 2e-3), (tuned_point, 1e-3)):
        sch = search.fixed_point(task.template(target), point)
        workload = db.commit_workload(task.template(target))
        args = ms.arg_info.ArgInfo.from_prim_func(task.template(target)["main"])
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [secs], target, args))
    logs = TuningLogs.load(tmp_path, target)
    assert logs.problems == [] and dict(logs.best(spec)[20]) == {tuned_point: 1e-3 / 10, default: 2e-3 / 10}
    plan = plan_kernel(spec, cell, target, tuned=logs.best(spec))
    at20 = next(b for b in plan.branches if b.up_to == 20)
    assert at20.tuned and at20.config == tuned_point, plan.describe()


def test_progress_line_does_not_call_a_remeasured_default_a_gain():
    """The search may sample a task's default point again; its second time against its first is noise, so the report
    names it a default point instead of a speed-up; another best point shows its ratio to the default."""
    from schedules.space import KernelConfig
    from tvmrnn.tuning.progress import TaskStats, line

    default, other = KernelConfig.of("cpu", rows=4, units=32, serpentine=1), KernelConfig.of("cpu", rows=2, units=16)
    st = TaskStats("GRU-h800", 0.100, {default})
    st.trials, st.best_s, st.best = 25, 0.095, default
    assert line(0, st, 1).endswith("(a default point)")
    st.best = other
    assert line(0, st, 1).endswith("(kernel alone: 1.05x the default point)")


@pytest.mark.slow  # the tuned fixture tunes for minutes on 2 cores
def test_tune_times_the_whole_module_and_keeps_the_default_where_it_wins(tuned, tmp_path):
    """The speed-up tune reports is the whole module's, default against tuned in the same run; a bucket where the tuned
    module was no faster runs the default at compile."""
    _, logs, output = tuned
    assert "whole module at batch 1, 20 steps: default" in output and "whole module at batch 4, 20 steps: default" in output
    bar = [int(n) for n in re.findall(r"(\d+)/6 \[", output)]
    assert all(n <= 6 for n in bar) and (not bar or max(bar) == 6), bar  # the bar counts toward --trials, never past it
    target = resolve_target("llvm")
    folder = logs / target_name(target)
    assert {json.loads(line)["batch"] for line in (folder / "verdicts.jsonl").read_text().splitlines()} == {1, 4}
    copy = tmp_path / "logs"
    shutil.copytree(logs, copy)
    (copy / target_name(target) / "verdicts.jsonl").unlink()
    found = TuningLogs.load(copy, target)
    key, buckets = next(iter(found.points.items()))
    batch = max(buckets)
    best = min(buckets[batch], key=lambda p: p[0])[1]
    lost = {"batch": batch, "default_ms": 1.0, "tuned_ms": 1.2, "kept_default": True, "points": {key: best.as_dict()}}
    (copy / target_name(target) / "verdicts.jsonl").write_text(json.dumps(lost) + "\n")
    kept = TuningLogs.load(copy, target)
    assert batch not in kept.points[key] and kept.defaults_won == 1


def test_tune_writes_to_the_user_cache_and_compile_reads_the_bundled_logs_too(monkeypatch, tmp_path):
    from tvmrnn.tuning.logs import bundled_logs_dir, default_logs_dir

    monkeypatch.delenv("TVMRNN_TUNING_LOGS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_logs_dir() == tmp_path / "tvmrnn" / "tuning_logs"
    bundled = bundled_logs_dir()
    if bundled is None or not (bundled / target_name(resolve_target("llvm"))).is_dir():
        pytest.skip("no bundled log for this CPU")
    found = TuningLogs.load(default_logs_dir(), resolve_target("llvm"))
    assert found.also_read == [bundled / target_name(resolve_target("llvm"))] and found.records > 0
    assert not [p for p in found.problems if "changed since" in p]  # stale bundled records go without a word
    assert TuningLogs.load(tmp_path / "elsewhere", resolve_target("llvm")).records == 0  # --logs DIR reads DIR only


def test_compile_reads_the_graph_records_of_the_bundled_logs_too(tmp_path):
    """The graph functions' database of every folder read (the user's and the bundled one) schedules compile's graph,
    as the recurrent records of both do; where both have one, MetaSchedule's union of them."""
    from tvm.s_tir import meta_schedule as ms

    from tvmrnn.build import _graph_records
    from tvmrnn.tuning.logs import GRAPH_PREFIX, RECORDS, WORKLOAD

    user, bundled = tmp_path / "user", tmp_path / "bundled"
    for folder in (user, bundled):
        folder.mkdir()
    (bundled / f"{GRAPH_PREFIX}{WORKLOAD}").write_text("")
    (bundled / f"{GRAPH_PREFIX}{RECORDS}").write_text("")
    logs = TuningLogs(resolve_target("llvm"), user, also_read=[bundled])
    assert isinstance(_graph_records(logs), ms.database.JSONDatabase)
    assert _graph_records(TuningLogs(resolve_target("llvm"), user)) is None
    (user / f"{GRAPH_PREFIX}{WORKLOAD}").write_text("")
    assert isinstance(_graph_records(logs), ms.database.UnionDatabase)


def test_a_verdict_against_a_bundled_point_keeps_the_default(monkeypatch, tmp_path):
    """tune's whole-module check found the tuned module no faster where the point it ran came from the bundled logs:
    compile runs the default there, not the bundled point."""
    from tvmrnn.tuning.logs import VERDICTS, bundled_logs_dir, default_logs_dir, target_dir

    monkeypatch.delenv("TVMRNN_TUNING_LOGS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = resolve_target("llvm")
    found = TuningLogs.load(default_logs_dir(), target)
    if bundled_logs_dir() is None or not found.points:
        pytest.skip("no bundled log for this CPU")
    key, buckets = next(iter(found.points.items()))
    batch, points = next(iter(buckets.items()))
    best = min(points, key=lambda p: p[0])[1]
    lost = {"batch": batch, "default_ms": 1.0, "tuned_ms": 1.2, "kept_default": True, "points": {key: best.as_dict()}}
    target_dir(default_logs_dir(), target).mkdir(parents=True)
    (target_dir(default_logs_dir(), target) / VERDICTS).write_text(json.dumps(lost) + "\n")
    kept = TuningLogs.load(default_logs_dir(), target)
    assert batch not in kept.points.get(key, {}) and kept.defaults_won == 1


def test_tune_without_logs_writes_to_the_user_cache(monkeypatch, tmp_path):
    """`tvmrnn tune MODEL` (no --logs) writes into ~/.cache/tvmrnn/tuning_logs ($XDG_CACHE_HOME), never the package."""
    from tvmrnn.interface import tune as tune_verb

    seen = []
    monkeypatch.setattr(tune_verb, "tune_command", lambda args, echo: seen.append(args.logs))
    monkeypatch.delenv("TVMRNN_TUNING_LOGS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = tmp_path / "small.onnx"
    onnx.save(CASE.model(), model)
    res = CliRunner().invoke(main, ["tune", str(model), "--trials", "1"])
    assert res.exit_code == 0 and seen == [str(tmp_path / "tvmrnn" / "tuning_logs")], (res.output, seen)
    assert CliRunner().invoke(main, ["tune", str(model), "--logs", str(tmp_path / "mine")]).exit_code == 0
    assert seen[-1] == str(tmp_path / "mine")


def test_stale_bundled_records_are_a_count_at_v_only(monkeypatch, tmp_path):
    """Bundled records timed on kernels that have changed since (R's layout here) go without a word; -v (which sets
    TVMRNN_VERBOSE) reports them once, as a count."""
    from schedules import recurrent_cpu
    from tvmrnn.tuning.logs import bundled_logs_dir, default_logs_dir

    monkeypatch.delenv("TVMRNN_TUNING_LOGS", raising=False)
    monkeypatch.delenv("TVMRNN_VERBOSE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = resolve_target("llvm")
    if bundled_logs_dir() is None or not TuningLogs.load(default_logs_dir(), target).records:
        pytest.skip("no bundled log for this CPU")
    monkeypatch.setattr(recurrent_cpu, "r_layout", lambda spec: "transposed")
    quiet = TuningLogs.load(default_logs_dir(), target)
    assert quiet.records == 0 and quiet.problems == []
    monkeypatch.setenv("TVMRNN_VERBOSE", "1")
    loud = TuningLogs.load(default_logs_dir(), target).problems
    assert len(loud) == 1 and re.search(r": \d+ record\(s\) skipped, timed on kernels whose arguments have changed", loud[0]), loud


def _matmul_lstm_matmul():
    """MatMul -> LSTM -> Squeeze -> MatMul over a symbolic `seq` (batch 1): its graph functions have static shapes only
    where --dim fixes seq."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    H, I = 8, 8
    arrays = {"W0": (I, I), "W": (1, 4 * H, I), "R": (1, 4 * H, H), "W1": (H, 4)}
    inits = [numpy_helper.from_array(rng.uniform(-0.3, 0.3, s).astype("float32"), n) for n, s in arrays.items()]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["p"]), helper.make_node("LSTM", ["p", "W", "R"], ["Y"], hidden_size=H),
             helper.make_node("Squeeze", ["Y", "axes"], ["s"]), helper.make_node("MatMul", ["s", "W1"], ["out"])]
    graph = helper.make_graph(nodes, "around_lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 1, I])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=10)


def test_tune_dim_makes_the_functions_over_it_tasks(tmp_path):
    """With seq open the MatMuls have no static shape to measure; --dim seq=10 makes them tasks, and the recurrent task
    runs the 10 steps compile builds for (not the default 100)."""
    from tvmrnn.interface.tune import TuneArgs, model_tasks

    path = tmp_path / "m.onnx"
    onnx.save(_matmul_lstm_matmul(), path)
    target = resolve_target("llvm")
    _, open_tasks, open_graph = model_tasks(TuneArgs(str(path), str(target), 1, str(tmp_path)), target)
    _, tasks, graph = model_tasks(TuneArgs(str(path), str(target), 1, str(tmp_path), input_shapes={"seq": 10}), target)
    assert open_graph == [] and [t.seq for t in open_tasks] == [100]
    assert any("dense" in t.task_name for t in graph), [t.task_name for t in graph]
    assert [(t.seq, t.batch) for t in tasks] == [(10, 1)]


def test_graph_records_of_a_fixed_dim_are_applied_by_compile_with_the_same_dim(tmp_path):
    """The MatMuls tuned at seq 10 (each default measured and stored) are found again by compile --dim seq=10 through
    the functions' hash and run (still matching ONNX Runtime); compiled with seq open, no function has such a record."""
    import onnxruntime as ort

    from tvmrnn.interface.tune import TuneArgs, model_tasks
    from tvmrnn.tuning.graph_tasks import tune_graph
    from tvmrnn.tuning.logs import target_dir

    path, logs = tmp_path / "m.onnx", tmp_path / "logs"
    onnx.save(_matmul_lstm_matmul(), path)
    target = resolve_target("llvm")
    _, _, graph = model_tasks(TuneArgs(str(path), str(target), 1, str(logs), input_shapes={"seq": 10}), target)
    stats = tune_graph(graph, target, target_dir(str(logs), target), trials=1, log=lambda _line: None)
    assert all(st.trials == 1 and st.best_s for st in stats), stats
    runner = CliRunner()
    for dims, tuned in ((["--dim", "seq=10"], True), ([], False)):
        out = tmp_path / f"m{len(dims)}.so"
        res = runner.invoke(main, ["compile", str(path), "-o", str(out), "--target", "llvm", "--logs", str(logs), *dims])
        assert res.exit_code == 0, res.output
        graph_tuned = json.loads(out.with_suffix(".json").read_text())["graph_tuned"]
        assert any("dense" in n for n in graph_tuned) if tuned else graph_tuned == [], (dims, graph_tuned)
    feeds = {"x": np.random.default_rng(1).standard_normal((10, 1, 8)).astype("float32")}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = next(iter(tvmrnn.load(str(tmp_path / "m2.so")).run(feeds).values()))
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


@pytest.mark.slow  # a recurrent trial, the whole module timed twice and a graph search: about 60 s on 2 shared cores
def test_tune_dim_times_the_whole_module_at_the_fixed_dims(tmp_path):
    """`tvmrnn tune --dim seq=10` tunes the graph functions over seq (their defaults, then MetaSchedule's search, which
    needs the CPU's core count on the target) and times the whole module at 10 steps (not at the 100 a free seq gets);
    compile with the same --dim runs the records."""
    path, logs = tmp_path / "m.onnx", tmp_path / "logs"
    onnx.save(_matmul_lstm_matmul(), path)
    res = CliRunner().invoke(main, ["tune", str(path), "--target", "llvm", "--trials", "1", "--graph-trials", "8",
                                    "--dim", "seq=10", "--logs", str(logs)])
    assert res.exit_code == 0, res.output
    assert "input shapes: seq=10" in res.output and "whole module at batch 1, 10 steps" in res.output, res.output
    found = re.search(r"\[graph 1/2\] (\d+) task\(s\).*dense", res.output)
    assert found and int(found.group(1)) < 8, res.output  # so MetaSchedule's own search ran past the defaults
    assert max(int(n) for n in re.findall(r"\] \w+: (\d+) trials, best \d", res.output)) >= 2, res.output
    compiled = tvmrnn.compile(str(path), target="llvm", logs=logs, input_shapes={"seq": 10})
    assert any("dense" in n for n in compiled.metadata["graph_tuned"]), compiled.metadata["graph_tuned"]


def test_tune_refuses_a_bad_dim_or_const_as_compile_does(tmp_path):
    """tune parses --dim/--const with compile's callbacks and specializes the model with compile's code: the same one-line
    error for each bad value, before anything is tuned."""
    path = tmp_path / "m.onnx"
    onnx.save(_matmul_lstm_matmul(), path)
    runner = CliRunner()
    for bad in (["--dim", "seq=0"], ["--dim", "x=1,0,8"], ["--dim", "seq"], ["--dim", "frames=3"], ["--dim", "x=10,8"],
                ["--const", "sr=16000"], ["--const", "x=a"]):
        tune = runner.invoke(main, ["tune", str(path), "--target", "llvm", "--logs", str(tmp_path / "logs"), *bad])
        compile_ = runner.invoke(main, ["compile", str(path), "-o", str(tmp_path / "m.so"), "--target", "llvm", *bad])
        errors = [[line for line in r.output.splitlines() if line.startswith(("error: ", "Error: "))] for r in (tune, compile_)]
        assert tune.exit_code == compile_.exit_code == 2 and len(errors[0]) == 1 and errors[0] == errors[1], (bad, tune.output,
                                                                                                            compile_.output)
        assert "Traceback" not in tune.output and "tuning:" not in tune.output, tune.output
    assert not (tmp_path / "logs").exists()


def test_compile_tune_passes_dim_and_const_to_tune(tmp_path, monkeypatch):
    """compile --tune N --dim --const tunes the model it then compiles: the same specialization reaches tune."""
    from tvmrnn.interface import compile as compile_verb

    seen = []

    def stop(args, echo=print):
        seen.append(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(compile_verb, "tune_command", stop)
    path = tmp_path / "m.onnx"
    onnx.save(_matmul_lstm_matmul(), path)
    CliRunner().invoke(main, ["compile", str(path), "-o", str(tmp_path / "m.so"), "--target", "llvm", "--tune", "3",
                              "--dim", "x=10,1,8", "--const", "y=1,2"])
    assert len(seen) == 1 and seen[0].input_shapes == {"x": [10, 1, 8]} and seen[0].consts == {"y": [1.0, 2.0]}


def test_graph_search_stops_at_the_time_budget(tmp_path):
    """With trials left for minutes of search, a budget of a few seconds ends it after the defaults and one round."""
    import time

    from tvmrnn.interface.tune import TuneArgs, model_tasks
    from tvmrnn.tuning.graph_tasks import tune_graph
    from tvmrnn.tuning.logs import target_dir

    path, logs = tmp_path / "m.onnx", tmp_path / "logs"
    onnx.save(_matmul_lstm_matmul(), path)
    target = resolve_target("llvm")
    _, _, graph = model_tasks(TuneArgs(str(path), str(target), 1, str(logs), input_shapes={"seq": 10}), target)
    started = time.monotonic()
    stats = tune_graph(graph, target, target_dir(str(logs), target), trials=2000, time_budget_s=1, log=lambda _line: None)
    assert time.monotonic() - started < 240 and sum(st.trials for st in stats) < 2000, stats
    assert all(st.trials >= 1 for st in stats), stats
