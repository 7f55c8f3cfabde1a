"""Task extraction: one tuning task per distinct recurrent kernel (layer shape and variant) and batch bucket.

A task's MetaSchedule workload is a template PrimFunc: the kernel's signature at static shapes, an
attribute naming the task (the layer without its node name, seq, batch) and an empty root block
whose annotations carry the sampled knobs. Two layers of the same shape share a task, and the
database matches a task again in a later run or another model by this workload alone.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import tvm
from tvm.script.ir_builder import tirx as T

from schedules import signature_kernel
from schedules.cells import cell_for
from schedules.layer import Activation, RNNLayerSpec

from ..plan import ModelPlan, PlanOptions, plan_model

TASK_ATTR = "tvmrnn.task"
DEFAULT_BATCHES = (1, 8, 64)  # buckets for a model whose batch is dynamic
DEFAULT_SEQ = 100  # steps measured when the model's sequence length is dynamic


def layer_key(spec: RNNLayerSpec) -> dict:
    """The layer as the kernel sees it: everything but the node's name."""
    d = dataclasses.asdict(spec)
    d.pop("name")
    if d["precision"] == "exact":
        d.pop("precision")  # keeps the keys of logs written before precision existed
    d["present"] = sorted(spec.present)
    d["activations"] = [[dataclasses.asdict(a) for a in acts] for acts in spec.activations]
    return d


def spec_from_key(d: dict, name: str = "tuning") -> RNNLayerSpec:
    d = dict(d)
    d["present"] = frozenset(d["present"])
    d["activations"] = tuple(tuple(Activation(**a) for a in acts) for acts in d["activations"])
    return RNNLayerSpec(name=name, **d)


@dataclass(frozen=True)
class RecurrentTask:
    spec: RNNLayerSpec
    seq: int
    batch: int
    layers: tuple[str, ...] = ()  # the model's nodes that share this kernel

    @property
    def cell(self):
        return cell_for(self.spec)

    def key(self) -> str:
        return json.dumps({"layer": layer_key(self.spec), "seq": self.seq, "batch": self.batch}, sort_keys=True)

    @property
    def name(self) -> str:
        s = self.spec
        return (f"{s.op}-h{s.hidden_size}-i{s.input_size}-{s.direction[:3]}-{s.dtype}-b{self.batch}-s{self.seq}")

    def template(self, target) -> tvm.IRModule:
        """The workload: the kernel's arguments at static shapes, the task attribute, an empty root block for the knobs."""
        def body(_a):
            with T.sblock("root"):
                T.evaluate(0)

        func = signature_kernel(self.spec, self.cell, target, body, self.seq, self.batch)
        func = func.with_attr(TASK_ATTR, self.key()).with_attr("global_symbol", "main")
        return tvm.IRModule({"main": func})


def task_of(mod: tvm.IRModule) -> RecurrentTask | None:
    """The task a workload module was made for, or None for a workload that is not ours."""
    func = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
    if func is None or func.attrs is None or TASK_ATTR not in func.attrs:
        return None
    d = json.loads(str(func.attrs[TASK_ATTR]))
    return RecurrentTask(spec_from_key(d["layer"]), int(d["seq"]), int(d["batch"]))


# the target a model's layers are planned for when only the kind is given (the specs depend on nothing else)
PLANNING_TARGETS = {True: "nvidia/nvidia-h100", False: "llvm"}


def extract_tasks(model, batches=None, seq=None, dtype=None, precision="exact", cuda=True) -> list[RecurrentTask]:
    """The tuning tasks of an ONNX model (a path or a ModelProto), its layers as `compile --dtype --precision` runs them
    on a CUDA target (cuda=True) or a CPU (plan_tasks says the rest)."""
    plan = plan_model(model, tvm.target.Target(PLANNING_TARGETS[cuda]), PlanOptions(storage=dtype, precision=precision))
    return plan_tasks(plan, batches, seq)


def plan_tasks(plan: ModelPlan, batches=None, seq=None) -> list[RecurrentTask]:
    """The planned model's tuning tasks: each distinct recurrent layer at each batch bucket.

    batches: the buckets to tune (default: the model's batch if static, else DEFAULT_BATCHES);
    seq: steps to measure (default: the model's if static, else DEFAULT_SEQ).
    """
    tasks: dict[str, RecurrentTask] = {}
    for layer in plan.layers:
        spec, x = layer.spec, layer.x_shape
        seq_dim, batch_dim = (x[0], x[1]) if len(x) == 3 and spec.layout == 0 else (x[1], x[0]) if len(x) == 3 else (None, None)
        steps = seq or (seq_dim if isinstance(seq_dim, int) and seq_dim > 0 else DEFAULT_SEQ)
        buckets = batches or ((batch_dim,) if isinstance(batch_dim, int) and batch_dim > 0 else DEFAULT_BATCHES)
        for b in buckets:
            task = RecurrentTask(dataclasses.replace(spec, name="tuning"), int(steps), int(b))
            prev = tasks.get(task.key())
            tasks[task.key()] = dataclasses.replace(task, layers=(prev.layers if prev else ()) + (spec.name,))
    return list(tasks.values())
