"""What MetaSchedule runs for our kernels: design spaces of knobs, a mutator, a builder and a feature extractor.

Our kernels are written as whole TIR programs (warp shuffles, grid barriers, shared-memory
residency), not as loop nests for schedule primitives to transform. So a design space is a
trace of `sample_categorical` decisions, one per knob of schedules/space.py, each annotated on
the workload's root block. Evolutionary search mutates those decisions (ChangeOneKnob); the
builder turns the annotated workload back into the kernel that point builds and compiles it
with our TIR pipeline; the feature extractor gives XGBoost the knob values and the task's shape,
so one cost model learns across all the shapes of a run.
"""

from __future__ import annotations

import os
import random
import sys
import time

import numpy as np

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from schedules import cooperative, point_kernel
from schedules.space import KernelConfig, kinds, knob_space

from ..runtime import kernel_device
from .tasks import RecurrentTask, task_of

KNOB = "tvmrnn."  # annotation prefix of a knob on the root block
KIND = KNOB + "kind"


def _root(sch: Schedule):
    return sch.get_sblock("root", func_name="main")


def config_of(mod: tvm.IRModule):
    """The KernelConfig a scheduled workload's root-block annotations describe."""
    sch = Schedule(mod)
    ann = sch.get(_root(sch)).annotations
    kind = str(ann[KIND])
    knobs = {k[len(KNOB):]: int(v) for k, v in ann.items() if k.startswith(KNOB) and k != KIND}
    return KernelConfig.of(kind, **knobs)


def design_spaces(task: RecurrentTask, target, choice: str = "auto") -> ms.space_generator.ScheduleFn:
    """One design space per kernel kind the layer may run (on CUDA: stepwise, tiled or mma, and the persistent kinds when R
    fits, persistent_mma also where it streams part of R)."""
    device = kernel_device(target)

    def sample(sch: Schedule):
        spaces = []
        for kind in kinds(task.spec, task.cell, target, choice, device):
            s = sch.copy()
            root = _root(s)
            s.annotate(root, KIND, kind)
            for knob, choices in knob_space(kind, task.spec, task.cell, target, device).items():
                value = choices[0] if len(choices) == 1 else s.sample_categorical(list(choices), [1.0 / len(choices)] * len(choices))
                s.annotate(root, KNOB + knob, value)
            spaces.append(s)
        return spaces

    return ms.space_generator.ScheduleFn(sample, sch_rules=[], postprocs=[], mutator_probs={ChangeOneKnob(): 1.0})


def point_trace(space: Schedule, config) -> tvm.s_tir.Trace:
    """The design space's trace with each knob's decision set to `config`'s value (to measure the default point)."""
    trace = space.trace
    for inst in trace.insts:
        if inst.kind.name == "SampleCategorical":
            # the annotation that consumes this decision names the knob
            use = next(i for i in trace.insts if i.kind.name == "Annotate" and inst.outputs[0].same_as(i.inputs[1]))
            knob = str(use.attrs[0])[len(KNOB):]
            candidates = [int(c) for c in inst.attrs[0]]
            trace = trace.with_decision(inst, candidates.index(config[knob]), remove_postproc=True)  # LATER_KNOBS too
    return trace


def fixed_point(mod: tvm.IRModule, config) -> Schedule:
    """A schedule of the workload that annotates `config`'s knobs as constants (no decisions for the search to mutate)."""
    sch = Schedule(mod)
    root = _root(sch)
    sch.annotate(root, KIND, config.kind)
    for knob, value in config.knobs:
        sch.annotate(root, KNOB + knob, value)
    return sch


@derived_object
class ChangeOneKnob(ms.mutator.PyMutator):
    """Mutation for evolutionary search: one knob's decision moves to another of its values."""

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, rand_state) -> tvm.s_tir.Trace | None:
        rng = random.Random(int(rand_state))
        sampled = [i for i in trace.insts if i.kind.name == "SampleCategorical" and len(i.attrs[0]) > 1]
        if not sampled:
            return None
        inst = rng.choice(sampled)
        current = int(trace.decisions[inst])
        choice = rng.choice([i for i in range(len(inst.attrs[0])) if i != current])
        return trace.with_decision(inst, choice, remove_postproc=True)

    def clone(self):
        return ChangeOneKnob()


def point_kernel_of(mod: tvm.IRModule, target) -> tvm.IRModule:
    """The kernel a scheduled workload stands for, at the workload's static shapes."""
    task = task_of(mod)
    func = point_kernel(task.spec, task.cell, target, config_of(mod), task.seq, task.batch, kernel_device(target))
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def build_point(mod: tvm.IRModule, target, _params=None):
    """MetaSchedule's builder function: compile the point's kernel with our pipeline (cooperative launch)."""
    started = time.monotonic()
    lib = tvm.tirx.build(point_kernel_of(mod, target), target=target, pipeline=cooperative.register())
    if os.environ.get("TVMRNN_TUNE_TRACE"):  # where does a slow round go? (the worker's stderr reaches the console)
        print(f"      trace: built {config_of(mod).describe()} in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return lib


@derived_object
class KernelFeatures(ms.feature_extractor.PyFeatureExtractor):
    """The point and the shape as XGBoost's features: each knob's value (log2) per kind, and the task's
    shape (hidden, input, batch, seq, gates, directions, bytes per weight).

    Shape features let one cost model learn across tasks (a run tunes many shapes at once). The
    per-store features MetaSchedule computes for loop nests would need each candidate's whole
    kernel built first (tenths of a second per point): measured on the H100, that starved the
    measurements of a 38-task run, so the knobs stand for the kernel instead.
    """

    def extract_from(self, context, candidates):
        return [tvm.runtime.tensor(point_features(cand.sch.mod)) for cand in candidates]


KINDS = ("cpu", "stepwise", "persistent", "tiled", "mma", "persistent_mma", "cluster")
KNOB_NAMES = ("rows", "units", "warps", "units_per_warp", "batch_tile", "blocks", "stage_h", "row_threads", "rows_per_thread", "k_chunk",
              "n_tiles", "n_warps", "k_warps", "depth", "prefetch", "split_acc", "half_operand", "streamed", "ring", "ring_h", "ctas", "registers", "sync")


def point_features(mod: tvm.IRModule) -> np.ndarray:
    task, config = task_of(mod), config_of(mod)
    s = task.spec
    shape = [s.hidden_size, s.input_size, task.batch, task.seq, task.cell.gates, s.num_directions, 4 if s.dtype == "float32" else 2]
    kind = [float(config.kind == k) for k in KINDS]
    knobs = dict(config.knobs)
    values = [knobs.get(k, 0) for k in KNOB_NAMES]
    return np.log2(1.0 + np.array([shape + kind + values], dtype="float32")).astype("float32")


def cost_model() -> ms.cost_model.XGBModel:
    # our spaces hold tens of points, not millions: train from the first measurements on
    return ms.cost_model.XGBModel(extractor=KernelFeatures(), num_warmup_samples=4, adaptive_training=False)


def search_strategy() -> ms.search_strategy.EvolutionarySearch:
    return ms.search_strategy.EvolutionarySearch(population_size=32, init_measured_ratio=0.25, init_min_unmeasured=2,
                                                 max_fail_count=8, genetic_num_iters=2)



def config_of_trace(trace, workload_mod: tvm.IRModule):
    """The point a tuning record measured: its trace replayed on its workload."""
    sch = Schedule(workload_mod)
    trace.apply_to_schedule(sch, remove_postproc=True)
    return config_of(sch.mod)
