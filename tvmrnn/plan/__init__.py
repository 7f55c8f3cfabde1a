"""Plan: every decision about how a model compiles, made once from its ONNX graph before any Relax is emitted.

`plan_model` reads the graph (node attributes, initializer shapes, input shapes) and returns a `ModelPlan`:
per recurrent layer its spec as compiled, the recurrent kernel's plan (schedules.plan_kernel, or a wavefront kernel's
where stacked layers run as one: schedules.stack_kernel), the input projection's GEMM; per graph the CUDA graph's
bounds. Compile emits what the plan says
(tvmrnn.frontend.converters), inspect prints it and tune takes its layers as tasks. The plan is immutable: nothing
flows back into it from the emission.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import onnx

from schedules import KERNEL_CHOICES, Device, KernelError, KernelPlan, StackKernel, plan_kernel, stack_kernel
from schedules.cells import cell_for
from schedules.layer import INPUT_NAMES, PRECISIONS

from ..cuda_graph import resolve as resolve_cuda_graph
from ..errors import UnsupportedModelError
from ..frontend import TensorInfo, index_bounds, load_onnx, model_inputs, model_opset
from ..frontend.graph_index import GraphIndex
from ..frontend.inspect import FoundLayer, find_rnn_layers
from ..frontend.rnn_spec import normalize_attrs, spec_from_node
from ..frontend.stacks import JoinedStates, StackMember, find_chains, head_constants, joined_states
from ..runtime import kernel_device
from .projection import Projection, plan_projection

STORAGE_DTYPES = ("float16", "bfloat16")
IN_THE_STEP = "in the stack's kernel, step by step"  # a stacked layer above the first (or any, in a block stack) projects its input so


@dataclass(frozen=True)
class PlanOptions:
    """compile's choices, checked (tvmrnn.build.compile_model documents each)."""

    kernel: str = "auto"  # schedules.KERNEL_CHOICES
    storage: str | None = None  # fp32 layers run in this dtype (float16 | bfloat16), None keeps each layer's
    precision: str = "exact"  # math of fp32 layers on CUDA (schedules.layer.PRECISIONS)
    max_dims: dict | None = None  # upper bounds of the inputs' symbolic dims
    cuda_graph: bool | None = None  # None: wherever every symbolic dim is bounded on CUDA

    def __post_init__(self):
        if self.kernel not in KERNEL_CHOICES:
            raise UnsupportedModelError(f"kernel={self.kernel!r} is not supported; one of {KERNEL_CHOICES}")
        if self.storage not in (None, "float32") + STORAGE_DTYPES:
            raise UnsupportedModelError(f"dtype={self.storage!r} is not supported; float32 (as the model is), float16 or bfloat16")
        if self.precision not in PRECISIONS:
            raise UnsupportedModelError(f"precision={self.precision!r} is not supported; one of {PRECISIONS}")
        if self.storage == "float32":
            object.__setattr__(self, "storage", None)


@dataclass(frozen=True)
class ChainPlan:
    """A chain of stacked layers (frontend.stacks) and whether it runs as one wavefront kernel."""

    layers: tuple[int, ...]  # the layers' indices, bottom first
    names: tuple[str, ...]
    specs: tuple  # each layer's spec as the wavefront kernel would run it (fewer where one is refused: why says so)
    members: tuple[StackMember, ...]  # the layers above the first: their ONNX nodes and constant inputs
    batch: object  # the first layer's batch dim: an int, or the symbolic dim's name
    kernel: StackKernel | None  # None: layer by layer
    why: str
    head: dict | None = None  # the first layer's W, R, B, P as arrays where constants (a kernel reading X takes them so)
    joined: JoinedStates | None = None  # the layers' states as one tensor in and one out, where the kernel takes them so

    def describe(self) -> str:
        names = " -> ".join(self.names)
        return f"{names}: " + (self.why if self.kernel else f"layer by layer ({self.why})")


@dataclass(frozen=True)
class LayerPlan:
    index: int  # the node's place among the graph's recurrent nodes (the order the frontend converts them in)
    spec: object  # RNNLayerSpec as compiled: storage dtype and precision applied; a stacked layer without its zero states
    x_shape: tuple  # X's dims as the graph declares them (ints, or names / "?" where dynamic)
    kernel: KernelPlan  # its recurrent kernel's, the projection's label in it
    projection: Projection | None  # None for a stacked layer above the first
    converts: bool  # an fp32 layer run in the storage dtype: its inputs cast to it, its outputs back to fp32
    graph_inputs: dict  # {"X" / "sequence_lens": the graph input it is}: the runtime checks lengths against X
    stack: ChainPlan | None = None  # the first layer of a chain run as one wavefront kernel: the chain it emits


@dataclass(frozen=True)
class GraphPlan:
    bounds: dict | None  # the symbolic dims' bounds a CUDA graph is captured with; None: no graph
    note: str  # why (not), for the log and the module's metadata
    enforced: dict  # the inputs' symbolic dims' bounds the module enforces (buffers are planned for them)


@dataclass(frozen=True)
class ModelPlan:
    target: object  # tvm.target.Target
    device: Device  # what the kernels are planned and emitted for (tvmrnn.runtime.kernel_device: SMs, CPU threads)
    options: PlanOptions
    opset: int
    inputs: tuple[TensorInfo, ...]
    layers: tuple[LayerPlan, ...]  # graph order
    chains: tuple[ChainPlan, ...]  # the chains of stacked layers (CUDA targets)
    graph: GraphPlan
    index_bounds: dict  # graph inputs used as Gather indices -> the table's size (frontend.index_bounds)
    refused: dict[int, FoundLayer] = field(default_factory=dict)  # index -> a node not supported (refuse=False only)

    def layer(self, index: int) -> LayerPlan:
        return next(layer for layer in self.layers if layer.index == index)


def _rows(spec, x_shape) -> int | None:
    seq, batch = _seq_batch(spec, x_shape)
    return seq * batch if isinstance(seq, int) and isinstance(batch, int) else None


def _seq_batch(spec, x_shape):
    if len(x_shape) != 3:
        return None, None
    return (x_shape[0], x_shape[1]) if spec.layout == 0 else (x_shape[1], x_shape[0])


def _graph_inputs(node, graph_inputs: set) -> dict:
    return {n: x for n, x in zip(INPUT_NAMES[node.op_type], node.input) if n in ("X", "sequence_lens") and x in graph_inputs}


def _member_spec(member: StackMember, x_shape, dtype: str, opset: int, options: PlanOptions):
    """The spec of a node above a chain's first as the stack's kernel runs it: its X (of x_shape) the Y below,
    reshaped; its zero initial states left out (the kernel starts from zeros)."""
    node = member.node
    attrs = normalize_attrs({a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})
    shapes = {"X": tuple(x_shape)} | {k: tuple(v.shape) for k, v in member.constants.items()}
    shapes |= {k: (1, x_shape[1], attrs["hidden_size"]) for k in member.states}
    if member.lengths:  # the first node's, which the kernel reads for every layer
        shapes["sequence_lens"] = (x_shape[1],)
    name = node.name or f"{node.op_type}_{member.index}"
    spec = spec_from_node(node.op_type, name, attrs, shapes, len(node.output), opset, dtype)
    return spec.compiled_as(options.storage, options.precision, cuda=True)


def plan_stack(specs: list, target, kernel: str, tuned: list, batch_bound: int | None, device: Device, reads_x: bool,
               joined_states: bool = False):
    """(the kernel of a chain of stacked layers or None, why) (schedules.stack_kernel)."""
    with _kernel_refusals():
        return stack_kernel(specs, [cell_for(s) for s in specs], target, kernel, tuned, batch_bound, device, reads_x,
                            joined_states)


def _layer_kernel(spec, target, kernel: str, tuned, device: Device) -> KernelPlan:
    """The recurrent kernel's plan of a layer run alone (schedules.plan_kernel)."""
    with _kernel_refusals():
        return plan_kernel(spec, cell_for(spec), target, kernel, tuned, device)


@contextmanager
def _kernel_refusals():
    """The kernel generators' refusals (schedules.KernelError) as compile's own error."""
    try:
        yield
    except KernelError as err:
        raise UnsupportedModelError(str(err)) from err


def _chain(opset: int, first: int, members, head: dict | None, joined, found, specs: dict, plan_args) -> ChainPlan:
    target, device, options, tuned, enforced = plan_args
    spec = specs[first]
    seq, batch = _seq_batch(spec, found[first].x_shape)
    chain, names = [spec], (spec.name,) + tuple(m.node.name or f"{m.node.op_type}_{m.index}" for m in members)
    layers = (first,) + tuple(m.index for m in members)
    for m in members:
        below = chain[-1]
        try:
            chain.append(_member_spec(m, (seq, batch, below.num_directions * below.hidden_size), found[first].spec.dtype,
                                      opset, options))
        except UnsupportedModelError as err:  # the node says so itself at its own plan
            return ChainPlan(layers, (spec.name, m.node.name or m.node.op_type), tuple(chain), tuple(members), batch, None, str(err))
    bound = batch if isinstance(batch, int) else enforced.get(batch)
    kernel, why = plan_stack(chain, target, options.kernel, [tuned(s) for s in chain], bound, device, head is not None,
                             joined is not None)
    joined = joined if kernel is not None and kernel.joined_states else None
    return ChainPlan(layers, names, tuple(chain), tuple(members), batch, kernel, why, head, joined)


def _table_rows(graph: GraphIndex, node) -> int | None:
    """The rows of the constant table the node's X is looked up in (GraphIndex.table_rows), where its W and B are
    constants too (the table's projection can then be computed at compile time); else None."""
    weights = [x for name, x in zip(INPUT_NAMES[node.op_type], node.input) if name in ("W", "B") and x]
    if any(graph.constant_shape(x) is None for x in weights):
        return None
    return graph.table_rows(node.input[0])


def _graph_plan(model, target, options: PlanOptions) -> GraphPlan:
    bounds, note = resolve_cuda_graph(model_inputs(model), target, options.max_dims, options.cuda_graph)
    return GraphPlan(bounds, note, dict(bounds if bounds is not None else options.max_dims or {}))


def _refuse(found: list[FoundLayer]):
    for layer in found:
        if not layer.supported:
            raise UnsupportedModelError(layer.problem)


def plan_model(model, target, options: PlanOptions = PlanOptions(), logs=None, refuse: bool = True) -> ModelPlan:
    """The plan of an ONNX model (a ModelProto or a path) for a resolved TVM target. logs: tuning logs
    (tuning.logs.TuningLogs) whose points the layers of their shapes run, or None for the defaults. refuse: raise the
    first unsupported node's error (compile); False plans the supported layers and lists the rest (inspect)."""
    model = load_onnx(model)
    graph = _graph_plan(model, target, options)  # (bad bounds are refused first, as they name no node)
    found = find_rnn_layers(model)
    if refuse:
        _refuse(found)
    cuda, opset, device = target.kind.name == "cuda", model_opset(model), kernel_device(target)
    tuned = logs.best if logs is not None else (lambda spec: None)
    specs = {i: f.spec.compiled_as(options.storage, options.precision, cuda) for i, f in enumerate(found) if f.supported}
    chains = [_chain(opset, first, members, head_constants(model, first), joined_states(model, first, members), found,
                     specs, (target, device, options, tuned, graph.enforced))
              for first, members in (find_chains(model).items() if cuda else ()) if first in specs]
    layers = _layers(model, found, specs, chains, (target, device, options, tuned, graph))
    return ModelPlan(target, device, options, opset, tuple(model_inputs(model)), tuple(layers), tuple(chains), graph,
                     index_bounds(model), {i: f for i, f in enumerate(found) if not f.supported})


def _layers(model, found, specs: dict, chains: list[ChainPlan], plan_args) -> list[LayerPlan]:
    target, device, options, tuned, graph = plan_args
    nodes = [n for n in model.graph.node if n.op_type in INPUT_NAMES]
    graph_inputs = {i.name for i in model_inputs(model)}
    index = GraphIndex(model)
    stacked = {i: c for c in chains if c.kernel is not None for i in c.layers}
    layers = []
    for i, spec in specs.items():
        node, chain = nodes[i], stacked.get(i)
        above_first = chain is not None and i != chain.layers[0]
        if chain is not None:
            at = chain.layers.index(i)
            spec, kernel = chain.specs[at], chain.kernel.plans[at]
        else:
            kernel = _layer_kernel(spec, target, options.kernel, tuned(spec), device)
        in_step = above_first or (chain is not None and chain.kernel.reads_x)
        projection = None if in_step else plan_projection(spec, target, _rows(spec, found[i].x_shape), _table_rows(index, node))
        layers.append(LayerPlan(
            i, spec, found[i].x_shape, replace(kernel, projection=projection.label if projection else IN_THE_STEP),
            projection, converts=options.storage is not None and found[i].spec.dtype == "float32",
            graph_inputs={} if above_first else _graph_inputs(node, graph_inputs),
            stack=chain if chain is not None and not above_first else None))
    return layers


__all__ = ["GraphPlan", "LayerPlan", "ModelPlan", "PlanOptions", "Projection", "ChainPlan", "plan_model",
           "plan_stack"]
