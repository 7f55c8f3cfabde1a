"""Compile: [1/4] import the ONNX graph, [2/4] plan it (tvmrnn.plan), [3/4] build: emit Relax as planned
(tvmrnn.frontend, tvmrnn.lowering) and compile it with `pipeline` (ours, then TVM's default Relax pipeline for the target)
and our TIR pipeline (the cooperative-launch tag persistent kernels need); [4/4] export as model.so + model.json.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import asdict

import onnx
import tvm
from tvm import relax
from tvm.target import codegen

from schedules import cooperative
from schedules.space import cooperative_blocks

from . import __version__
from .cuda_graph import PASS_CONFIG as GRAPH_PASS_CONFIG
from .cuda_graph import annotate as annotate_bounds
from .cuda_graph import captured as graph_captured
from .errors import UnsupportedModelError
from .fold import fold_relayouts
from .frontend import load_onnx, model_opset, to_relax
from .graph_pipeline import graph_pipeline
from .plan import ModelPlan, PlanOptions, plan_model
from .runtime import FORMAT, Module, metadata_path
from .tuning.logs import GRAPH_PREFIX, WORKLOAD, TuningLogs, default_logs_dir

TARGET_ALIASES = {"cuda": "nvidia/nvidia-h100", "gpu": "nvidia/nvidia-h100"}


def gpu_present() -> bool:
    try:
        return tvm.cuda(0).exist
    except Exception:  # no CUDA driver at all
        return False


def resolve_target(target=None) -> tvm.target.Target:
    """None: the local GPU if there is one, else this CPU. "llvm": this CPU's instruction set.
    "cuda": the local GPU's arch, or the H100 tag without a GPU. Anything else TVM reads as a target: a tag, a target
    string or a JSON dict such as {"kind": "cuda", "arch": "sm_90"}."""
    if isinstance(target, tvm.target.Target):
        return target
    if target is None:
        target = "cuda" if gpu_present() else "llvm"
    if target in ("llvm", "cpu"):
        # like -march=native: plain "llvm" would mean baseline x86-64 (SSE2), 4x slower here;
        # give an explicit target (e.g. "llvm -mcpu=x86-64-v3") to build for other machines
        return tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
    if isinstance(target, str) and target in TARGET_ALIASES:
        if gpu_present():
            target = tvm.target.Target.from_device(tvm.cuda(0))
            if str(target.attrs["arch"]) == "sm_90":  # built for this very GPU: Hopper's arch-specific wgmma is safe to use
                target = tvm.target.Target({**dict(target.export()), "arch": "sm_90a"})
            return target
        target = TARGET_ALIASES[target]
    try:
        return tvm.target.Target(target)
    except Exception as err:
        raise UnsupportedModelError(f"target {target!r} is not a TVM target: {err}; use llvm, cuda or a tag such as nvidia/nvidia-h100") from err


def _layer_dict(layer) -> dict:
    spec, kernel = layer.spec, layer.kernel
    d = asdict(spec)
    d["present"] = sorted(spec.present)
    d["activations"] = [[asdict(a) for a in acts] for acts in spec.activations]
    d["kernel"] = kernel.describe()
    d["projection"] = kernel.projection  # the input projection's GEMM
    d["tuned"] = kernel.tuned  # some batch bucket runs a point from the tuning logs (schedule says which)
    d["schedule"] = [b.as_dict() for b in kernel.branches]
    # the grid its persistent kernels launch with every block resident: a GPU with fewer SMs cannot run them
    d["cooperative_blocks"] = max(cooperative_blocks(b.config, spec) for b in kernel.branches)
    d["graph_inputs"] = dict(layer.graph_inputs)
    return d


class CompiledModule(Module):
    """A module built in this process: runs like a loaded one and can be exported."""

    def __init__(self, executable, metadata):
        self.executable = executable
        super().__init__(executable, metadata, device=None if metadata["target_kind"] != "cuda" or gpu_present() else "cpu")

    def export(self, path) -> str:
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.executable.export_library(path)
        with open(metadata_path(path), "w") as f:
            json.dump(self.metadata, f, indent=2)
        return path


class _ExportOnly:
    """A CUDA module built on a machine without a GPU: it can be exported but not run here."""

    def __init__(self, executable, metadata):
        self.executable, self.metadata = executable, metadata

    export = CompiledModule.export

    def run(self, feeds):
        raise UnsupportedModelError(f"this module targets {self.metadata['target']} and there is no GPU here; export it and run it on one")


def _quiet(_msg):
    pass


def _tuning_logs(logs, target, log):
    """The tuning logs compile applies: `logs` is a folder, None for the default one, or False for none."""
    if logs is False:
        return None
    found = TuningLogs.load(default_logs_dir() if logs is None else logs, target)
    for problem in found.problems:
        log(f"      warning: {problem}")
    log(f"      tuning logs: {found.records} record(s) in {found.where}" if found.records else f"      tuning logs: none for this target in {found.where}")
    if found.defaults_won:
        log(f"      the default kept for {found.defaults_won} layer batch bucket(s): tune timed the tuned module no faster there")
    return found


def _graph_records(tuning):
    """The graph functions' tuning databases beside the recurrent logs read (the bundled folder's too), or None; where
    several have a function, MetaSchedule's union takes the fastest record."""
    read = [] if tuning is None else [tuning.folder, *tuning.also_read]
    folders = [f for f in read if (f / f"{GRAPH_PREFIX}{WORKLOAD}").exists()]
    if not folders:
        return None
    from tvm.s_tir import meta_schedule as ms  # MetaSchedule's import is slow: only where there are records

    from .tuning.graph_tasks import graph_database

    databases = [graph_database(f) for f in folders]
    return databases[0] if len(databases) == 1 else ms.database.UnionDatabase(*databases)


def pipeline(target, plan: ModelPlan, graph_records=None, on_tuned=None) -> tvm.transform.Pass:
    """The Relax pipeline a planned module is built with (what `tvm.compile` receives):
    1. weight re-layouts on initializers (transposes, stacked biases, casts to the storage dtype) become constants
       (TVM's default pipeline does not fold them, and they ran at every call): the simple ones with numpy
       (fold.fold_relayouts), the rest by FoldConstant; and the functions that only computed them go
       (DeadCodeElimination: no dead kernels, e.g. W's scaled fp16 halves for the f16x3 GEMM);
    2. main's symbolic dims bounded where the module enforces bounds (and allowed into the CUDA graph where it has one);
    3. TVM's backend pipeline for the target with the graph's other layers scheduled (tvmrnn.graph_pipeline), by the
       tuning records of `graph_records` (a MetaSchedule database) where it has them; on_tuned(names) hears which."""
    bounds = plan.graph.bounds if plan.graph.bounds is not None else plan.graph.enforced

    @tvm.transform.module_pass(opt_level=0, name="tvmrnn.AnnotateBounds")
    def bound_dims(mod, _ctx):
        return annotate_bounds(mod, dict(bounds)) if plan.graph.bounds is not None or bounds else mod

    return tvm.transform.Sequential([fold_relayouts, relax.transform.FoldConstant(), relax.transform.DeadCodeElimination(), bound_dims,
                                     graph_pipeline(target, graph_records, on_tuned)], name="tvmrnn.pipeline")


def _log_plan(plan: ModelPlan, log):
    for layer in plan.layers:
        spec = layer.spec
        log(f"      {spec.op} '{spec.name}': hidden {spec.hidden_size}, input {spec.input_size}, {spec.direction}, "
            f"layout {spec.layout}, {spec.dtype}{'' if spec.precision == 'exact' else ' (' + spec.precision + ')'} -> "
            f"{layer.kernel.describe()}; input projection: {layer.kernel.projection}")
    for chain in plan.chains:
        log(f"      stack {chain.describe()}")


def _build(model: onnx.ModelProto, plan: ModelPlan, graph_records=None, on_tuned=None):
    """The planned model as Relax (our kernels where the plan says), built by the pipeline and our TIR pipeline (the
    cooperative-launch tag persistent kernels' grid barriers need). Returns (executable, Relax model, CUDA graph note)."""
    relax_model = to_relax(model, plan)
    with tvm.transform.PassContext(config=GRAPH_PASS_CONFIG if plan.graph.bounds is not None else {}):
        executable = tvm.compile(relax_model.mod, target=plan.target, relax_pipeline=pipeline(plan.target, plan, graph_records, on_tuned),
                                 tir_pipeline=cooperative.register())
    note = plan.graph.note
    if plan.graph.bounds is not None and not graph_captured(executable):
        note = ("off (no kernel runs between the inputs and the outputs, and TVM captures only kernels whose "
                "buffers it plans statically: outputs are allocated per call)")
    return executable, relax_model, note


def _metadata(source: str, plan: ModelPlan, relax_model, graph_note: str, tuning, graph_tuned=()) -> dict:
    target = plan.target
    return {
        "format": FORMAT,
        "source": os.path.basename(source),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": str(target),
        "target_kind": target.kind.name,
        "versions": {"tvmrnn": __version__, "tvm": tvm.__version__, "onnx_opset": plan.opset},
        "inputs": [i.as_dict() for i in relax_model.inputs],
        "outputs": [o.as_dict() for o in relax_model.outputs],
        "layers": [_layer_dict(layer) for layer in plan.layers],
        "stacks": [chain.describe() for chain in plan.chains],
        "index_bounds": plan.index_bounds,
        "max_dims": dict(plan.graph.enforced),
        "cuda_graph": graph_note,
        "tuning_logs": str(tuning.folder) if tuning and (tuning.records or graph_tuned) else None,
        "graph_tuned": list(graph_tuned),  # the functions around the recurrent kernels that ran tuning records
    }


def compile_model(model, target=None, log=_quiet, kernel="auto", dtype=None, logs=None, precision="exact", max_dims=None,
                  cuda_graph=None, input_shapes=None, consts=None):
    """ONNX model -> runnable (or, for CUDA without a GPU, exportable) module, in stages: [1/4] import (read the ONNX
    graph), [2/4] plan (tvmrnn.plan: every layer's kernels, the stacks, the CUDA graph), [3/4] build (emit Relax as
    planned, `pipeline`, tvm.compile); [4/4] is the module's export. `log` gets a line per stage.

    kernel: the recurrent schedule on CUDA: "auto" (at batch 1 on sm_90 and newer, the cluster kernel for 64 to
    1024 units: one thread-block cluster below 512, a grid of them from there; persistent where R fits on chip and
    the batch is small; above that persistent_mma where R fits in shared memory across one wave, to any batch in exact
    fp32 of more than 256 units and in half precision or TF32 of LSTM from 1024, else to batch 32 and mma above;
    otherwise mma on tensor cores for fp16/bf16 and TF32, stepwise and at large batch tiled for exact fp32, with
    persistent_mma streaming part of R from L2 at batch 33-64 where R is larger than shared memory), or one kind.
    dtype: "float16" or "bfloat16" runs the fp32 model's recurrent layers with that storage
    (weights and projection in half precision, fp32 accumulation and state); None keeps each layer's.
    precision: math of fp32 layers on CUDA (CPU kernels are always exact): "exact" fp32 (the default), or
    "tf32" (opt-in): the projection and the recurrent step above persistent's batches on TF32 tensor cores,
    operands rounded to a 10-bit mantissa, accumulation and state in fp32 (errors near 1e-3, not 1e-6).
    logs: tuning logs folder (None: tvmrnn.tuning.logs.default_logs_dir(); False: untuned defaults);
    each layer runs its tuned points where the logs have its shape for this target.
    max_dims: upper bounds of the inputs' symbolic dims ({"seq": 512, "batch": 64}); larger inputs are refused.
    cuda_graph: replay each run as one CUDA graph (tvmrnn.cuda_graph): None (auto) wherever every symbolic dim has a
    bound on a CUDA target, True to require it, False for none.
    input_shapes, consts: dims and inputs the model is specialized for (frontend.prepare).
    """
    options = PlanOptions(kernel, dtype, precision, max_dims, cuda_graph)
    target = resolve_target(target)
    source = os.fspath(model) if not isinstance(model, onnx.ModelProto) else "<ModelProto>"
    started = time.perf_counter()
    model = load_onnx(model, input_shapes, consts)
    log(f"[1/4] imported {source}: opset {model_opset(model)}, "
        f"{len(model.graph.node)} node(s) ({time.perf_counter() - started:.1f} s)")
    started = time.perf_counter()
    tuning = _tuning_logs(logs, target, log)
    plan = plan_model(model, target, options, tuning)
    log(f"[2/4] planned {len(plan.layers)} recurrent layer(s) for {target.kind.name} ({time.perf_counter() - started:.1f} s)")
    _log_plan(plan, log)
    started = time.perf_counter()
    graph_tuned: list[str] = []
    executable, relax_model, graph_note = _build(model, plan, _graph_records(tuning), graph_tuned.extend)
    log(f"[3/4] built for {target.kind.name} ({time.perf_counter() - started:.1f} s); CUDA graph {graph_note}")
    if graph_tuned:
        log(f"      tuned graph functions: {', '.join(graph_tuned)}")
    metadata = _metadata(source, plan, relax_model, graph_note, tuning, graph_tuned)
    if target.kind.name == "cuda" and not gpu_present():
        return _ExportOnly(executable, metadata)
    return CompiledModule(executable, metadata)
