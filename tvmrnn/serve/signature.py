"""What serving needs to know about one model, read from its model.json: batching, padding, recurrent state.

- **Batch dim**: the symbolic dim along which requests are concatenated. Its name is chosen once per model
  and its axis looked up in every input and output by that name, so layout-0 RNN inputs (`X` is
  [seq, batch, ...], state [layers, batch, hidden]) batch along axis 1 and layout-1 ones along axis 0.
  The name is the one shared by all inputs and outputs that looks like a batch ("batch", "N", "bs", ...),
  else the batch dim of the first recurrent layer's `X` (axis 1 for layout 0, 0 for layout 1), else the
  only symbolic dim every input and output has. A model whose every output does not have it runs one
  request at a time (batching would mix requests).
- **Padding**: where a recurrent layer's `X` and `sequence_lens` are both graph inputs, requests of different
  sequence lengths are zero-padded to the longest along the `X` sequence dim (their own `sequence_lens`
  mask the padding) and outputs with that dim are cut back. `padding_is_exact` checks this on the model at
  start: a model whose outputs change under padding runs different lengths separately.
- **State pairs** (streaming): an input `NAME_in` goes with the output `NAME_out` when both have the same
  dtype and shape (case-insensitive suffixes `_in`/`_out`); `--state MODEL:INPUT=OUTPUT` replaces this rule
  for a model. The stored output of one request is the input of the next request of the same sequence.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputError
from ..runtime import ModuleInputs, random_inputs
from .protocol import NUMPY_TO_V2, ProtocolError

_V2_OF_DTYPE = {np.dtype(k): v for k, v in NUMPY_TO_V2.items()}  # keyed by dtype: str(dtype) is slow in numpy 2
_BATCH_NAME = re.compile(r"^(n|b|bs|batch.*|.*_batch|.*batch_size|num_seq.*)$", re.IGNORECASE)


@dataclass
class Plan:
    """How a merged batch splits back: each request's rows and, when padded, its own padded-dim length."""

    rows: list[int]
    lengths: list[int | None]
    width: int  # rows of the merged batch: sum(rows), or the bucket it was padded to


@dataclass
class Signature:
    name: str
    metadata: dict
    batch_dim: str | None = None
    batchable: bool = False
    why_not_batchable: str = ""
    axes: dict[str, dict[str, int]] = field(default_factory=dict)  # dim name -> {tensor name: axis}
    pad_dim: str | None = None
    state_pairs: list[tuple[str, str]] = field(default_factory=list)
    checker: ModuleInputs | None = None  # the runtime's own checks; the VM lives in the worker process
    _free_axes_of: tuple = field(default=(None, None), repr=False, compare=False)  # (pad_dim, plan): group_key's cache
    _keys: dict = field(default_factory=dict, repr=False, compare=False)  # input shapes -> group key (group_key's cache)

    def batch_limit(self, configured: int) -> int:
        """Rows a merged batch may hold: the server's max_batch_size, and no more than the module's bound on its batch dim
        (compile's max_dims: its buffers and CUDA graphs are planned for it)."""
        bound = self.metadata.get("max_dims", {}).get(self.batch_dim) if self.batch_dim else None
        return min(configured, bound) if bound else configured

    @property
    def inputs(self) -> list[dict]:
        return self.metadata["inputs"]

    @property
    def outputs(self) -> list[dict]:
        return self.metadata["outputs"]

    @functools.cached_property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.inputs]

    @functools.cached_property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]

    # -- v2 ---------------------------------------------------------------------------------------
    def v2_metadata(self) -> dict:
        def tensor(t):
            return {"name": t["name"], "datatype": NUMPY_TO_V2.get(t["dtype"], t["dtype"].upper()),
                    "shape": [d if isinstance(d, int) else -1 for d in t["shape"]]}

        return {"name": self.name, "versions": ["1"], "platform": f"tvmrnn_{self.metadata.get('target_kind', 'llvm')}",
                "inputs": [tensor(t) for t in self.inputs], "outputs": [tensor(t) for t in self.outputs]}

    def triton_config(self, max_batch_size: int, max_delay_ms: float, sequence_idle_s: float) -> dict:
        """The model's configuration as Triton's `GET /v2/models/NAME/config` gives it (model_config.proto as JSON).

        Triton batches along the first axis and leaves it out of `dims`: so does this where the batch dim is every tensor's
        axis 0; a model batched along another axis (layout-0 RNNs: [seq, batch, ...]) says max_batch_size 0, full dims, and
        names its batch dim in `parameters` (the server still batches it dynamically)."""
        axes = self.axes.get(self.batch_dim, {}) if self.batchable else {}
        leading = bool(axes) and all(ax == 0 for ax in axes.values())

        def tensor(t):
            dims = [d if isinstance(d, int) else -1 for d in t["shape"]]
            return {"name": t["name"], "data_type": "TYPE_" + NUMPY_TO_V2.get(t["dtype"], t["dtype"].upper()),
                    "dims": dims[1:] if leading else dims}

        config = {"name": self.name, "platform": "", "backend": "tvmrnn", "version_policy": {"latest": {"num_versions": 1}},
                  "max_batch_size": self.batch_limit(max_batch_size) if leading else 0,
                  "input": [tensor(t) for t in self.inputs], "output": [tensor(t) for t in self.outputs],
                  "instance_group": [{"name": self.name, "kind": "KIND_GPU" if self.metadata.get("target_kind") == "cuda"
                                      else "KIND_CPU", "count": 1}],
                  "parameters": {"target": {"string_value": str(self.metadata.get("target_kind", "llvm"))}}}
        if self.batchable:
            config["dynamic_batching"] = {"max_queue_delay_microseconds": int(max_delay_ms * 1000)}
            config["parameters"]["batch_dim"] = {"string_value": self.batch_dim}
            config["parameters"]["max_batch_rows"] = {"string_value": str(self.batch_limit(max_batch_size))}
        if self.state_pairs:
            by_name = {t["name"]: t for t in self.inputs}
            config["sequence_batching"] = {
                "max_sequence_idle_microseconds": int(sequence_idle_s * 1e6),
                "state": [{"input_name": i, "output_name": o, "data_type": tensor(by_name[i])["data_type"],
                           "dims": tensor(by_name[i])["dims"], "initial_state": [{"name": f"{i}_zeros", "zero_data": True,
                           "data_type": tensor(by_name[i])["data_type"], "dims": tensor(by_name[i])["dims"]}]}
                          for i, o in self.state_pairs]}
        return config

    # -- checks -----------------------------------------------------------------------------------
    def check(self, feeds: dict[str, np.ndarray], datatypes: dict[str, str] | None = None) -> None:
        """Raise ProtocolError (400) naming what is wrong: names, v2 datatypes, shapes, empty dims, sequence_lens."""
        expected = self._v2_inputs
        for name, arr in feeds.items():
            if name not in expected:
                raise ProtocolError(f"unknown input {name!r}; model {self.name!r} has inputs {self.input_names}")
            want, rank = expected[name]
            got = (datatypes and datatypes.get(name)) or _V2_OF_DTYPE.get(arr.dtype) or str(arr.dtype)
            if got != want:
                raise ProtocolError(f"input {name!r} has datatype {got}; model {self.name!r} expects {want}")
            if arr.ndim == rank and 0 in arr.shape:
                raise ProtocolError(f"input {name!r} has shape {list(arr.shape)} with an empty dimension; every dimension must be at least 1")
        try:
            self.checker.check_inputs(feeds)
        except InputError as err:
            msg = str(err)
            missing = [s for s, _ in self.state_pairs if s not in feeds]
            if missing and msg.startswith("missing input"):
                msg += f" (state inputs {missing} are filled by the server for requests with a sequence_id parameter)"
            raise ProtocolError(msg) from None

    @functools.cached_property
    def _v2_inputs(self) -> dict[str, tuple[str, int]]:
        """Input name -> (v2 datatype, rank): what `check` compares a request's tensors with."""
        return {t["name"]: (NUMPY_TO_V2.get(t["dtype"], t["dtype"]), len(t["shape"])) for t in self.inputs}

    def rows(self, feeds: dict[str, np.ndarray]) -> int:
        """The request's batch size (1 for a model that does not batch)."""
        if not self.batchable:
            return 1
        for n, ax in self.axes[self.batch_dim].items():
            if n in feeds:
                return int(feeds[n].shape[ax])
        return 1

    def dim_sizes(self, feeds: dict[str, np.ndarray]) -> dict[str, int]:
        """Symbolic dim name -> size, as the given inputs set them."""
        sizes = {}
        for info in self.inputs:
            if info["name"] in feeds:
                for d, n in zip(info["shape"], feeds[info["name"]].shape):
                    if isinstance(d, str):
                        sizes.setdefault(d, int(n))
        return sizes

    def zero_state(self, name: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Zeros for state input `name`, its symbolic dims sized from the other inputs of the request."""
        info = next(t for t in self.inputs if t["name"] == name)
        sizes = self.dim_sizes(feeds)
        unknown = [d for d in info["shape"] if isinstance(d, str) and d not in sizes]
        if unknown:
            raise ProtocolError(f"cannot size the initial state {name!r} {info['shape']}: no other input sets {unknown}; send {name!r} with sequence_start")
        return np.zeros([d if isinstance(d, int) else sizes[d] for d in info["shape"]], info["dtype"])

    # -- batching ---------------------------------------------------------------------------------
    def group_key(self, feeds: dict[str, np.ndarray]):
        """Requests with equal keys can run in one batch: equal shapes off the batch (and padded) axes,
        and byte-equal inputs that have no batch axis."""
        if not self.batchable:
            return object()  # unique: runs alone
        free_axes = self._free_axes()
        shapes = tuple(feeds[name].shape for name, _ in free_axes)
        key = self._keys.get(shapes)  # the key of every request of these shapes, unless an input has no batch axis
        if key is not None:
            return key
        key = []
        for name, free in free_axes:
            arr = feeds[name]
            if free is None:
                key.append((name, arr.shape, arr.tobytes()))
            else:
                shape = list(arr.shape)
                for ax in free:
                    shape[ax] = None
                key.append(tuple(shape))
        key = tuple(key)
        if all(free is not None for _, free in free_axes):
            if len(self._keys) >= 1024:
                self._keys.clear()
            self._keys[shapes] = key
        return key

    def _free_axes(self) -> list[tuple[str, tuple[int, ...] | None]]:
        """Per input in order, the axes requests may differ in within one batch (its batch and padded axes), None for
        an input without a batch axis; worked out once per pad_dim (loading may switch padding off)."""
        if self._free_axes_of[0] != self.pad_dim or self._free_axes_of[1] is None:
            batch_axes = self.axes[self.batch_dim]
            pad_axes = self.axes.get(self.pad_dim, {}) if self.pad_dim else {}
            plan = [(n, (batch_axes[n],) + ((pad_axes[n],) if n in pad_axes else ()) if n in batch_axes else None)
                    for n in self.input_names]
            self._free_axes_of = (self.pad_dim, plan)
            self._keys.clear()
        return self._free_axes_of[1]

    def merge(self, requests: list[dict[str, np.ndarray]], bucket: int | None = None,
              buffers: Callable[[str, tuple, np.dtype], np.ndarray] | None = None,
              rows: list[int] | None = None) -> tuple[list[np.ndarray], Plan]:
        """One batch in the model's input order, and the plan to split its outputs back.

        bucket: pad the batch dim with filler rows up to this many (shapes then repeat, so a CUDA module replays the graph
        it captured for that shape); buffers(name, shape, dtype): a pre-allocated array to assemble each input into
        (valid until the next merge), instead of a new one. Filler rows are zeros (lengths 1); split drops them. rows: each
        request's (`rows`), where known."""
        rows = rows or [self.rows(r) for r in requests]
        total = sum(rows)
        width = max(total, bucket or 0)
        if len(requests) == 1 and width == total and buffers is None:
            return [requests[0][n] for n in self.input_names], Plan(rows, [None], total)
        batch_axes = self.axes[self.batch_dim] if self.batchable else {}
        pad_axes = self.axes.get(self.pad_dim, {}) if self.pad_dim else {}
        lengths: list[int | None] = [None] * len(requests)
        if pad_axes and len(requests) > 1:
            x, ax = next((n, a) for n, a in pad_axes.items() if n in self.input_names)
            lengths = [int(r[x].shape[ax]) for r in requests]
        longest = max((n for n in lengths if n is not None), default=None)
        merged = []
        for name in self.input_names:
            if name not in batch_axes:
                merged.append(requests[0][name])
                continue
            bax, pax = batch_axes[name], pad_axes.get(name) if longest is not None else None
            shape = list(requests[0][name].shape)
            shape[bax] = width
            if pax is not None:
                shape[pax] = longest
            out = buffers(name, tuple(shape), requests[0][name].dtype) if buffers else np.empty(shape, requests[0][name].dtype)
            if pax is None:  # one copy of every request's rows, then the filler rows
                np.concatenate([r[name] for r in requests], axis=bax, out=out[(slice(None),) * bax + (slice(0, total),)])
            else:
                self._merge_padded(out, [r[name] for r in requests], rows, bax, pax)
            if width > total:
                filler = out[(slice(None),) * bax + (slice(total, None),)]
                filler.fill(1 if name in self._lens_inputs else 0)  # filler rows run with length 1: valid, one step
            merged.append(out)
        return merged, Plan(rows, lengths, width)

    @functools.cached_property
    def _lens_inputs(self) -> frozenset:
        return frozenset(sl.lens for sl in self.checker.sequence_lens)

    @staticmethod
    def _merge_padded(out: np.ndarray, parts: list[np.ndarray], rows: list[int], bax: int, pax: int) -> None:
        """Each request's rows at its place along `bax`, zeros past its own length along `pax`."""
        out.fill(0)
        start = 0
        for part, n in zip(parts, rows):
            index = [slice(None)] * out.ndim
            index[bax] = slice(start, start + n)
            index[pax] = slice(0, part.shape[pax])
            out[tuple(index)] = part
            start += n

    def split(self, outputs: list[np.ndarray], plan: Plan) -> list[dict[str, np.ndarray]]:
        """Per-request output dicts (arrays of their own) from a batch's outputs (in the model's output order)."""
        batch = BatchOutputs(self, outputs, plan)
        return [batch.request(i) for i in range(len(plan.rows))]

    def take_rows(self, named: dict[str, np.ndarray], start: int, rows: int, length: int | None) -> dict[str, np.ndarray]:
        """Views of rows [start, start + rows) of each output along its batch axis, cut to `length` along the padded axis
        (None or -1: not cut)."""
        batch_axes = self.axes[self.batch_dim]
        pad_axes = self.axes.get(self.pad_dim, {}) if self.pad_dim and length is not None and length >= 0 else {}
        mine = {}
        for name, arr in named.items():
            index = [slice(None)] * arr.ndim
            index[batch_axes[name]] = slice(start, start + rows)
            if name in pad_axes:
                index[pad_axes[name]] = slice(0, length)
            mine[name] = arr[tuple(index)]
        return mine


class BatchOutputs:
    """A run batch's outputs by name and its plan. A request's own outputs are `request(i)` (arrays of their own: the
    batch's split), or, for several requests at once, `gather(indices)`: their rows back to back, one copy per output."""

    __slots__ = ("sig", "named", "plan", "starts")

    def __init__(self, sig: Signature, outputs: list[np.ndarray], plan: Plan):
        self.sig, self.named, self.plan = sig, dict(zip(sig.output_names, outputs)), plan
        self.starts = [0]
        for n in plan.rows:
            self.starts.append(self.starts[-1] + n)

    def request(self, i: int) -> dict[str, np.ndarray]:
        plan = self.plan
        if len(plan.rows) == 1 and plan.width == plan.rows[0]:
            return self.named
        return {k: v.copy() for k, v in self.sig.take_rows(self.named, self.starts[i], plan.rows[i], plan.lengths[i]).items()}

    def gather(self, indices: list[int]) -> tuple[list[int], list[int], dict[str, np.ndarray]]:
        """(rows, lengths (-1: not padded), outputs) of requests `indices`: their rows in that order along the batch axes,
        at the batch's padded length (each request's own length says where to cut it)."""
        plan, starts = self.plan, self.starts
        rows = [plan.rows[i] for i in indices]
        lengths = [-1 if plan.lengths[i] is None else plan.lengths[i] for i in indices]
        first, last = indices[0], indices[-1]
        if indices == list(range(first, last + 1)):
            where = slice(starts[first], starts[last + 1])
        else:
            where = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in indices]) if any(r != 1 for r in rows) \
                else np.array([starts[i] for i in indices])
        batch_axes = self.sig.axes[self.sig.batch_dim]
        out = {}
        for name, arr in self.named.items():
            bax = batch_axes[name]
            out[name] = arr[(slice(None),) * bax + (where,)] if isinstance(where, slice) else np.take(arr, where, axis=bax)
        return rows, lengths, out


def _axes_by_dim(metadata: dict) -> dict[str, dict[str, int]]:
    """dim name -> {tensor: axis}; a name used twice in one tensor maps to -1 there (not usable)."""
    axes: dict[str, dict[str, int]] = {}
    for t in metadata["inputs"] + metadata["outputs"]:
        for ax, d in enumerate(t["shape"]):
            if isinstance(d, str):
                axes.setdefault(d, {})[t["name"]] = -1 if t["name"] in axes.get(d, {}) else ax
    return axes


def _choose_batch_dim(metadata: dict, axes: dict) -> str | None:
    everywhere = [d for d, where in axes.items()
                  if all(t["name"] in where for t in metadata["inputs"] if t["shape"] and any(isinstance(x, str) for x in t["shape"]))
                  and all(o["name"] in where for o in metadata["outputs"])]
    named = [d for d in axes if _BATCH_NAME.match(d)]
    for d in named:
        if d in everywhere:
            return d
    for layer in metadata.get("layers", []):
        x = layer.get("graph_inputs", {}).get("X")
        info = next((t for t in metadata["inputs"] if t["name"] == x), None)
        if info is not None and len(info["shape"]) == 3:
            d = info["shape"][1 if layer.get("layout", 0) == 0 else 0]
            if isinstance(d, str):
                return d
    if named:
        return named[0]
    return everywhere[0] if len(everywhere) == 1 else None


def _state_pairs(name: str, metadata: dict, explicit: list[tuple[str, str]] | None) -> list[tuple[str, str]]:
    ins = {t["name"]: t for t in metadata["inputs"]}
    outs = {t["name"]: t for t in metadata["outputs"]}
    if explicit is not None:
        for i, o in explicit:
            if i not in ins:
                raise InputError(f"--state: {i!r} is not an input of model {name!r}; inputs are {list(ins)}")
            if o not in outs:
                raise InputError(f"--state: {o!r} is not an output of model {name!r}; outputs are {list(outs)}")
            a, b = ins[i]["shape"], outs[o]["shape"]
            if (ins[i]["dtype"] != outs[o]["dtype"] or len(a) != len(b)
                    or any((isinstance(x, int) or isinstance(y, int)) and x != y for x, y in zip(a, b))):
                raise InputError(f"--state {i}={o}: input {i!r} {ins[i]['dtype']} {a} and output {o!r} "
                                 f"{outs[o]['dtype']} {b} differ in dtype or shape")
        return list(explicit)
    pairs = []
    lower_outs = {n.lower(): n for n in outs}
    for inp, info in ins.items():
        if not inp.lower().endswith("_in"):
            continue
        out = lower_outs.get(inp.lower()[:-3] + "_out")
        if out and outs[out]["dtype"] == info["dtype"] and outs[out]["shape"] == info["shape"]:
            pairs.append((inp, out))
    return pairs


def build_signature(name: str, metadata: dict, state: list[tuple[str, str]] | None = None) -> Signature:
    """Read batching, padding and state pairs from a module's metadata (see the module docstring)."""
    axes = _axes_by_dim(metadata)
    sig = Signature(name, metadata, axes=axes, state_pairs=_state_pairs(name, metadata, state), checker=ModuleInputs(metadata))
    sig.batch_dim = _choose_batch_dim(metadata, axes)
    if sig.batch_dim is None:
        sig.why_not_batchable = "no symbolic batch dim shared by the inputs and outputs"
    else:
        where = axes[sig.batch_dim]
        lacking = [o["name"] for o in metadata["outputs"] if where.get(o["name"], -1) < 0]
        twice = [n for n, ax in where.items() if ax < 0]
        if lacking:
            sig.why_not_batchable = f"output(s) {lacking} have no {sig.batch_dim!r} dim"
        elif twice:
            sig.why_not_batchable = f"{twice} have {sig.batch_dim!r} twice"
        else:
            sig.batchable = True
    if sig.batchable:
        for sl in sig.checker.sequence_lens:
            x = next(t for t in metadata["inputs"] if t["name"] == sl.x)
            if len(x["shape"]) != 3:
                continue
            d = x["shape"][sl.seq_axis]
            if isinstance(d, str) and d != sig.batch_dim and all(ax >= 0 for ax in axes[d].values()):
                sig.pad_dim = d
                break
    return sig


def padding_is_exact(sig: Signature, run: Callable[[list[np.ndarray]], list[np.ndarray]], seed: int = 0) -> bool:
    """Run two rows padded to a longer length and alone; True when the outputs agree (so padding may be used)."""
    if sig.pad_dim is None:
        return False
    short, long_ = 3, 5
    feeds = random_inputs(sig.checker, {sig.batch_dim: 2, sig.pad_dim: short}, seed, {})
    for lens in (sl.lens for sl in sig.checker.sequence_lens):  # one row shorter than the padded length, one full
        if lens in feeds:
            feeds[lens] = feeds[lens].copy()
            feeds[lens][-1] = short - 1
    alone = run([feeds[n] for n in sig.input_names])
    pad_axes = sig.axes[sig.pad_dim]
    padded_in = []
    for n in sig.input_names:
        a = feeds[n]
        if n in pad_axes:
            ax = pad_axes[n]
            a = np.pad(a, [(0, long_ - short) if i == ax else (0, 0) for i in range(a.ndim)])
        padded_in.append(a)
    padded = run(padded_in)
    for name, a, p in zip(sig.output_names, alone, padded):
        if name in pad_axes:
            index = [slice(None)] * p.ndim
            index[pad_axes[name]] = slice(0, short)
            p = p[tuple(index)]
        if a.shape != p.shape or not np.allclose(a, p, rtol=1e-4, atol=1e-5):
            return False
    return True


def parse_state_option(values) -> dict[str, list[tuple[str, str]]]:
    """`MODEL:INPUT=OUTPUT` strings -> {model: [(input, output), ...]}."""
    out: dict[str, list[tuple[str, str]]] = {}
    for v in values:
        m = re.fullmatch(r"([^:]+):([^=]+)=(.+)", v)
        if not m:
            raise InputError(f"--state {v!r} is not MODEL:INPUT=OUTPUT")
        out.setdefault(m.group(1), []).append((m.group(2), m.group(3)))
    return out

