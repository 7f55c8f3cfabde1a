"""Build: ONNX model -> Relax module with our kernels -> TVM executable; export as model.so + model.json.

The target decides which kernels the lowering picks; `tvm.compile` runs TVM's default
Relax pipeline for it (dlight schedules the generic GEMMs on CUDA) and our TIR pipeline,
which adds the cooperative-launch tag persistent kernels need.
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

from schedules.layer import PRECISIONS

from . import __version__
from .cuda_graph import PASS_CONFIG as GRAPH_PASS_CONFIG
from .cuda_graph import annotate as annotate_bounds
from .cuda_graph import captured as graph_captured
from .cuda_graph import resolve as cuda_graph_plan
from .errors import UnsupportedModelError
from .frontend import import_onnx, load_onnx, model_inputs
from .runtime import FORMAT, Module, metadata_path

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
        from tvm.target import codegen

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


def _layer_dict(spec, imported) -> dict:
    d = asdict(spec)
    d["present"] = sorted(spec.present)
    d["activations"] = [[asdict(a) for a in acts] for acts in spec.activations]
    plan = imported.kernels.get(spec.name)
    d["kernel"] = plan.describe()
    d["projection"] = plan.projection  # the input projection's GEMM
    d["tuned"] = plan.tuned  # some batch bucket runs a point from the tuning logs (schedule says which)
    d["schedule"] = [b.as_dict() for b in plan.branches]
    from schedules.space import cooperative_blocks

    # the grid its persistent kernels launch with every block resident: a GPU with fewer SMs cannot run them
    d["cooperative_blocks"] = max(cooperative_blocks(b.config, spec) for b in plan.branches)
    d["graph_inputs"] = imported.graph_inputs.get(spec.name, {})
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


STORAGE_DTYPES = ("float16", "bfloat16")


def _tuning_logs(logs, target, log):
    """The tuning logs compile applies: `logs` is a folder, None for the default one, or False for none."""
    if logs is False:
        return None
    from .tuning.logs import TuningLogs, default_logs_dir

    found = TuningLogs.load(default_logs_dir() if logs is None else logs, target)
    for problem in found.problems:
        log(f"      warning: {problem}")
    log(f"      tuning logs: {found.records} record(s) in {found.folder}" if found.records else f"      tuning logs: none for this target in {found.folder}")
    return found


def compile_model(model, target=None, log=_quiet, kernel="auto", dtype=None, logs=None, precision="exact", max_dims=None,
                  cuda_graph=None):
    """ONNX model -> runnable (or, for CUDA without a GPU, exportable) module. `log` gets one line per stage.

    kernel: the recurrent schedule on CUDA: "auto" (persistent where R fits on chip and the batch is
    small; above that persistent_mma where R fits in shared memory across one wave, in half precision and
    TF32 up to batch 32; otherwise mma on tensor cores for fp16/bf16 and TF32, stepwise and at large batch
    tiled for exact fp32, with persistent_mma streaming part of R from L2 at batch 33-64 where R is larger than
    shared memory), or one kind.
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
    """
    from schedules import KERNEL_CHOICES, cooperative

    if kernel not in KERNEL_CHOICES:
        raise UnsupportedModelError(f"kernel={kernel!r} is not supported; one of {KERNEL_CHOICES}")
    if dtype not in (None, "float32") + STORAGE_DTYPES:
        raise UnsupportedModelError(f"dtype={dtype!r} is not supported; float32 (as the model is), float16 or bfloat16")
    if precision not in PRECISIONS:
        raise UnsupportedModelError(f"precision={precision!r} is not supported; one of {PRECISIONS}")
    target = resolve_target(target)
    source = os.fspath(model) if not isinstance(model, onnx.ModelProto) else "<ModelProto>"
    started = time.perf_counter()
    tuning = _tuning_logs(logs, target, log)
    model = load_onnx(model)
    # decided before the import, which routes the recurrent kernels' model inputs and outputs through copies for it
    bounds, graph_note = cuda_graph_plan(model_inputs(model), target, max_dims, cuda_graph)
    # inputs' symbolic dims beyond these are refused: intermediate buffers are planned for them
    enforced = dict(bounds if bounds is not None else max_dims or {})
    imported = import_onnx(model, target, kernel, None if dtype in (None, "float32") else dtype, tuning.best if tuning else None,
                           precision, graph_copies=bounds is not None, dim_bounds=enforced)
    log(f"[1/2] imported {source}: opset {imported.opset}, {len(imported.layers)} recurrent layer(s) "
        f"({time.perf_counter() - started:.1f} s)")
    for spec in imported.layers:
        log(f"      {spec.op} '{spec.name}': hidden {spec.hidden_size}, input {spec.input_size}, {spec.direction}, "
            f"layout {spec.layout}, {spec.dtype}{'' if spec.precision == 'exact' else ' (' + spec.precision + ')'} -> {imported.kernels[spec.name].describe()}; input projection: {imported.kernels[spec.name].projection}")
    for stack in imported.stacks:
        log(f"      stack {stack}")
    started = time.perf_counter()
    # weight re-layouts on initializers (transposes, stacked biases, casts to the storage dtype) become constants
    # here: TVM's default pipeline does not fold them, and they ran at every call (CPU: naive transposes of R,
    # 11 of lat-b1-h512-l2's 28 ms on this VM; CUDA: a cast+transpose of W before each fp16 projection)
    # (and the functions that only computed them, such as W's scaled fp16 halves for the f16x3 GEMM, go: no dead kernels)
    mod = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(imported.mod))
    # our pipeline = TVM's + the cooperative-launch tag that persistent kernels' grid barriers need
    if bounds is not None or max_dims:
        mod = annotate_bounds(mod, bounds if bounds is not None else dict(max_dims))
    with tvm.transform.PassContext(config=GRAPH_PASS_CONFIG if bounds is not None else {}):
        executable = tvm.compile(mod, target=target, tir_pipeline=cooperative.register())
    if bounds is not None and not graph_captured(executable):
        graph_note = ("off (no kernel runs between the inputs and the outputs, and TVM captures only kernels whose "
                      "buffers it plans statically: outputs are allocated per call)")
    log(f"[2/2] built for {target.kind.name} ({time.perf_counter() - started:.1f} s); CUDA graph {graph_note}")
    metadata = {
        "format": FORMAT,
        "source": os.path.basename(source),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": str(target),
        "target_kind": target.kind.name,
        "versions": {"tvmrnn": __version__, "tvm": tvm.__version__, "onnx_opset": imported.opset},
        "inputs": [i.as_dict() for i in imported.inputs],
        "outputs": [o.as_dict() for o in imported.outputs],
        "layers": [_layer_dict(s, imported) for s in imported.layers],
        "stacks": imported.stacks,
        "index_bounds": imported.index_bounds,
        "max_dims": enforced,
        "cuda_graph": graph_note,
        "tuning_logs": str(tuning.folder) if tuning and tuning.records else None,
    }
    if target.kind.name == "cuda" and not gpu_present():
        return _ExportOnly(executable, metadata)
    return CompiledModule(executable, metadata)
