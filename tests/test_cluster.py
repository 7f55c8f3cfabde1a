"""The cluster kernel (schedules/recurrent_cluster.py): one thread-block cluster per direction, h passed through
distributed shared memory. On the GPU, against float64 on fresh inputs with outputs poisoned (tests/test_kernels.py's
check); without one, that it builds through NVRTC and ptxas for sm_90a with the cluster launch, the DSMEM stores and
no block barrier inside the steps, and that only layers whose R fits a cluster can name it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm

import tvmrnn
from compiled import target_of
from onnx_cases import Case
from schedules import KernelError, cooperative, plan_kernel, point_kernel
from schedules.cells import cell_for, own_gate_activations
from schedules.device import Device
from schedules.ptxas import ptxas
from schedules.recurrent_cluster import fits
from schedules.space import KernelConfig, cooperative_blocks, default_config, knob_space
from test_kernels import _check_kernel

SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
EXACT, HALF = (1e-5, 1e-5), (1e-2, 1e-2)


def _layer(op, hidden, direction="forward", dtype="float32", lbr=0, layout=0):
    """A layer with initial states and sequence_lens (and B where linear_before_reset, so Rb_h is not zero)."""
    optional = ("B",) * bool(lbr) + ("sequence_lens", "initial_h") + (("initial_c",) if op == "LSTM" else ())
    case = Case(op=op, direction=direction, optional=optional, hidden=hidden, input_size=16, linear_before_reset=lbr,
                layout=layout)
    spec = dataclasses.replace(case.spec(), dtype=dtype)
    return dataclasses.replace(case, dtype=dtype), spec


def _point(spec, grid=False, **knobs) -> KernelConfig:
    """The default point with `knobs` set; one cluster a direction (at 16 warps) where the default is a grid of them,
    unless `grid` or the knobs name clusters."""
    base = dict(default_config("cluster", spec, cell_for(spec), SM90A).knobs)
    if not grid and base.get("clusters", 1) > 1:
        base.update(clusters=1, warps=16)
    return KernelConfig.of("cluster", **{**base, **knobs})


def _run(case, spec, config, batches=(1, 2, 1, 2), steps=(1, 1, 50, 50)):
    func = point_kernel(spec, cell_for(spec), target_of("cuda"), config)
    tol = EXACT if spec.dtype == "float32" else HALF
    _check_kernel("cuda", case, spec, func, "rows", batches=batches, steps=steps, tol=tol, note=config.describe())


def _fits(op, hidden, dtype) -> bool:
    _, spec = _layer(op, hidden, dtype=dtype)
    return fits(spec, cell_for(spec), Device())


LAYERS = [(op, h, dtype) for op in ("LSTM", "GRU") for h in (128, 256, 512) for dtype in ("float32", "float16")]


# sync 0: a cluster barrier a phase; sync 1: st.async counted on mbarriers (a wrong count hangs: run these apart, under
# a timeout)
SYNCS = [pytest.param(0, id="sync0"), pytest.param(1, id="sync1")]


@pytest.mark.gpu
@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("layer", LAYERS, ids=lambda v: "-".join(map(str, v)))
def test_cluster_matches_float64(layer, direction, sync):
    """Batch 1 and 2, T 1 and 50 (sequence_lens shorter than the sequence), fp32 to 1e-5 and fp16 to 1e-2; R in
    registers and shared memory as the default splits it (LSTM fp32 H512: half of each row in registers)."""
    op, hidden, dtype = layer
    if not _fits(op, hidden, dtype):
        pytest.skip(f"{op} H{hidden} {dtype}: R does not fit a cluster")
    case, spec = _layer(op, hidden, direction, dtype)
    _run(case, spec, _point(spec, sync=sync))


# GRU with linear_before_reset (one phase), both directions at once (two clusters), layout 1, batch tiles (rows past the
# batch), 8 warps (several units a warp), 8 CTAs where the default takes 16 (half of R from shared memory), odd hidden
# sizes (CTAs with units past H)
OTHER_POINTS = [(("GRU", 256, "bidirectional", "float32", 1, 0), {}), (("LSTM", 256, "bidirectional", "float16", 0, 1), {}),
                (("GRU", 512, "forward", "float16", 0, 0), {"batch_tile": 2}), (("LSTM", 128, "reverse", "float32", 0, 0), {"batch_tile": 4}),
                (("LSTM", 256, "forward", "float32", 0, 0), {"warps": 8}), (("GRU", 256, "forward", "float32", 0, 0), {"ctas": 8}),
                (("GRU", 100, "bidirectional", "float32", 1, 1), {"batch_tile": 2}), (("LSTM", 33, "forward", "float16", 0, 0), {}),
                (("LSTM", 256, "forward", "float32", 0, 0), {"batch_groups": 4}),
                (("GRU", 128, "bidirectional", "float16", 0, 1), {"batch_groups": 2, "batch_tile": 2})]


@pytest.mark.gpu
@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("layer, knobs", OTHER_POINTS, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_cluster_other_points(layer, knobs, sync):
    """Batches of several chunks (5 rows at batch_tile 2 or 4: a last chunk with rows past the batch), T 50, 9 and 1;
    with batch groups, clusters that run two chunks (their mbarriers' phases counted on), one and none. H 33 runs
    sync 0 only (a CTA without units: sync 1 refuses it)."""
    op, hidden, direction, dtype, lbr, layout = layer
    case, spec = _layer(op, hidden, direction, dtype, lbr, layout)
    config = _point(spec, **knobs, sync=sync)
    if not _config_valid(spec, config):
        pytest.skip(f"{config.describe()} is not a point of the space for H{hidden}")
    _run(case, spec, config, batches=(1, 3, 5), steps=(50, 9, 1))


# several clusters a direction, exchanging through tagged words in global memory: the default grids of H1024 (4 clusters
# of 16 CTAs) in both cells and dtypes, both directions at once (4 clusters of 8 each), GRU without
# linear_before_reset (its r*h forwarded too), single values forwarded (19 units a CTA), batch tiles, 8-CTA clusters
GRID_POINTS = [(("LSTM", 1024, "forward", "float32", 0, 0), {}), (("LSTM", 1024, "reverse", "float16", 0, 0), {}),
               (("GRU", 1024, "forward", "float32", 1, 0), {}), (("GRU", 1024, "bidirectional", "float16", 0, 1), {"clusters": 4, "ctas": 8, "warps": 8}),
               (("GRU", 600, "forward", "float32", 0, 0), {"clusters": 2, "ctas": 16, "warps": 16}),
               (("LSTM", 512, "bidirectional", "float32", 0, 0), {"clusters": 2, "ctas": 16, "batch_tile": 2}),
               (("LSTM", 512, "forward", "float16", 0, 0), {"clusters": 4, "ctas": 8, "warps": 8})]


@pytest.mark.gpu
@pytest.mark.parametrize("layer, knobs", GRID_POINTS, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_cluster_grid_matches_float64(layer, knobs):
    """Batches of one and several chunks, T 50, 9 and 1, against float64: what each CTA forwards from the other
    clusters' words is what their CTAs computed, at every step and row."""
    op, hidden, direction, dtype, lbr, layout = layer
    case, spec = _layer(op, hidden, direction, dtype, lbr, layout)
    config = _point(spec, grid=True, **knobs)
    assert config["clusters"] > 1 and _config_valid(spec, config), config.describe()
    _run(case, spec, config, batches=(1, 3, 5), steps=(50, 9, 1))


# the gate programs whose activations do not all run in the lanes of their sums (warp_gemv lane_activation): LSTM
# peepholes (only the cell gate apart) with a clip, input_forget, GRU's candidate under linear_before_reset, functions
# other than sigmoid and tanh, and a function per direction
CELL_VARIANTS = [dict(op="LSTM", optional=("B", "P", "initial_h", "initial_c"), clip=2.5),
                 dict(op="LSTM", input_forget=1, activations=("HardSigmoid", "Tanh", "Softsign"), activation_alpha=(0.3,),
                      activation_beta=(0.4,)),
                 dict(op="GRU", optional=("B",), linear_before_reset=1, activations=("Sigmoid", "Relu"), clip=1.5),
                 dict(op="GRU", direction="bidirectional", activations=("Sigmoid", "Tanh", "HardSigmoid", "Softsign"),
                      activation_alpha=(0.25,), activation_beta=(0.5,)),
                 dict(op="RNN", activations=("Relu",))]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", CELL_VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v)[:60])
def test_cluster_cell_variants(variant):
    """The default point (sync 1) against float64 for cells whose gates are activated apart from their sums in part
    or not at all: batch 1 and 2, T 1 and 50."""
    case = Case(**{"hidden": 128, "input_size": 16, "direction": "forward", **variant})
    spec = case.spec()
    _run(case, spec, _point(spec))


def _config_valid(spec, config) -> bool:
    from schedules.space import _cluster_config

    return _cluster_config(config, spec).valid(spec)


@pytest.mark.gpu
@pytest.mark.parametrize("sync", SYNCS)
def test_sampled_points_are_correct(sync):
    """Every point of the space is a correct kernel (the tuner may pick any): three a sync, fixed seed, batches of many
    chunks."""
    case, spec = _layer("GRU", 256, "bidirectional")
    space = knob_space("cluster", spec, cell_for(spec), target_of("cuda"))
    rng = np.random.default_rng(3)
    for _ in range(3):
        config = KernelConfig.of("cluster", **{k: int(rng.choice(v)) for k, v in space.items()} | {"sync": sync})
        _run(case, spec, config, batches=(6, 37), steps=(9, 9))


@pytest.mark.gpu
def test_kernel_cluster_compiles_a_model():
    """kernel='cluster' through the whole compiler: the module runs the cluster kernel and matches ONNX Runtime's model."""
    case = Case(op="LSTM", hidden=256, input_size=32, optional=("initial_h", "initial_c"))
    module = tvmrnn.compile(case.model(), target="cuda", kernel="cluster", logs=False)
    assert "cluster(" in module.metadata["layers"][0]["kernel"]
    feeds = case.feeds(np.random.default_rng(0), 20, 1)
    got = module.run(feeds)
    for name, want in case.reference(feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def _source(spec, config) -> str:
    func = point_kernel(spec, cell_for(spec), SM90A, config)
    return tvm.tirx.build(func, target=SM90A, pipeline=cooperative.register()).imports[0].inspect_source()


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("layer", [("LSTM", 256, "float32", 0, 1, "bidirectional"), ("GRU", 512, "float32", 0, 1, "bidirectional"),
                                   ("GRU", 256, "float16", 1, 2, "bidirectional"), ("LSTM", 512, "float16", 0, 4, "bidirectional"),
                                   ("LSTM", 512, "float32", 0, 1, "bidirectional")], ids=lambda v: "-".join(map(str, v)))
def test_cluster_builds_without_a_gpu(layer, sync):
    """NVRTC and ptxas for sm_90a: the launch is bound to clusterCtaIdx.x, values go out with mapa + st.shared::cluster
    and a cluster barrier ends each phase (sync 0), or staged, sent up to 4 units a st.async after a block barrier a
    phase, and counted on mbarriers that each phase waits on, with one cluster barrier a chunk (sync 1); the other
    block barriers are the three outside the steps (TVM's planner sees none of the kernel's own stores); ptxas spills
    at most a few words (8 bytes in LSTM H512 fp32 bidirectional)."""
    op, hidden, dtype, lbr, batch_tile, direction = layer
    _, spec = _layer(op, hidden, direction, dtype, lbr)
    src = _source(spec, _point(spec, batch_tile=batch_tile, sync=sync))
    assert "%cluster_ctarank" in src and "mapa.shared::cluster" in src
    phases = len(cell_for(spec).phases)
    if sync:
        assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in src and "mbarrier.try_wait.parity.acquire.cluster" in src
        assert src.count("tvmrnn_cluster_barrier();") == 1 and src.count("tvmrnn_mbarrier_wait((") == phases + 1
    else:
        assert "st.shared::cluster.f32" in src and src.count("tvmrnn_cluster_barrier();") == 1 + phases
    assert src.count("__syncthreads();") == 3 + phases * sync and "__launch_bounds__(512, 1)" in src
    report = ptxas(src, "sm_90a")
    assert report.spill_stores <= 32, report.describe()


@pytest.mark.parametrize("layer", [("LSTM", 1024, "float32"), ("GRU", 600, "float32")], ids=lambda v: "-".join(map(str, v)))
def test_cluster_grid_builds_without_a_gpu(layer):
    """A grid of clusters: one grid barrier after its words are cleared, each unit published as a tagged word, the
    other clusters' polled (4 words at a time where a CTA's units come in fours) and sent on by st.async; launched
    cooperatively (all clusters resident); ptxas spills at most a few words."""
    op, hidden, dtype = layer
    _, spec = _layer(op, hidden, dtype=dtype)
    config = _point(spec, grid=True, **({} if hidden == 1024 else {"clusters": 2, "ctas": 16, "warps": 16}))
    func = point_kernel(spec, cell_for(spec), SM90A, config)
    built = tvm.tirx.build(func, target=SM90A, pipeline=cooperative.register())
    src = built.imports[0].inspect_source()
    width = 4 if config["clusters"] * config["ctas"] * 4 <= hidden and hidden % 64 == 0 else 1
    assert src.count("tvm_builtin_cuda_grid_sync();") == 1 and "tvmrnn_publish_tagged(" in src
    assert f"tvmrnn_cluster_forward{width}(tvmrnn_wait_tagged{'4' if width == 4 else ''}(" in src, width
    assert cooperative_blocks(config, spec) == config["clusters"] * config["ctas"]  # what load checks against the SMs
    assert ptxas(src, "sm_90a").spill_stores <= 32


def test_batch_groups_build_without_a_gpu():
    """Clusters side by side, each its own chunks of the batch: D x P x C CTAs, no grid barrier (an ordinary launch,
    not a cooperative one), and no spills."""
    _, spec = _layer("LSTM", 256, "bidirectional", "float32")
    config = _point(spec, batch_groups=4, ctas=8)
    func = point_kernel(spec, cell_for(spec), SM90A, config)
    assert f'T.thread_binding(T.int64({2 * 4 * 8}), thread="blockIdx.x")' in func.script()
    src = tvm.tirx.build(func, target=SM90A, pipeline=cooperative.register()).imports[0].inspect_source()
    assert "grid_sync" not in src and cooperative_blocks(config, spec) == 0
    assert ptxas(src, "sm_90a").spill_stores == 0


def test_gates_activated_apart_read_only_their_own_sum():
    """cells.own_gate_activations: the gates whose activation reads nothing but its own sum and XW, which the cluster
    kernel computes in the lanes holding the sum. LSTM's four (its cell gate with tanh), none of the peephole gates,
    no forget gate under input_forget; GRU's z and r, and the candidate only in the two-phase form; RNN's one."""
    def found(**kw):
        spec = Case(**{"hidden": 8, "input_size": 4, **kw}).spec()
        return [own_gate_activations(p) for p in cell_for(spec).phases]

    assert found(op="LSTM") == [{0: 0, 1: 0, 2: 0, 3: 1}]
    assert found(op="LSTM", optional=("B", "P")) == [{3: 1}]
    assert found(op="LSTM", input_forget=1) == [{0: 0, 1: 0, 3: 1}]
    assert found(op="GRU", optional=("B",), linear_before_reset=1) == [{0: 0, 1: 0}]
    assert found(op="GRU") == [{0: 0, 1: 0}, {2: 1}]
    assert found(op="RNN") == [{0: 0}]


def test_cluster_launch_params(tmp_path):
    """The exported module carries clusterCtaIdx.x among the kernel's launch parameters (TVM's runtime then launches
    with the cluster dimension, and above 8 CTAs allows the non-portable size)."""
    _, spec = _layer("GRU", 512, dtype="float32")
    assert default_config("cluster", spec, cell_for(spec), SM90A)["ctas"] == 16
    func = point_kernel(spec, cell_for(spec), SM90A, _point(spec))
    path = tmp_path / "cluster.so"
    tvm.compile(tvm.IRModule({"main": func}), target=SM90A, tir_pipeline=cooperative.register()).export_library(str(path))
    assert b"clusterCtaIdx.x" in path.read_bytes()


def test_only_layers_that_fit_name_it():
    """kernel='cluster' where each direction's R fits a cluster's shared memory (smallest cluster first), else a grid of
    clusters', a one-line error elsewhere (R too large, or no clusters before sm_90); auto picks it at batch 1, and
    as clusters side by side, one row each, up to batch 4 to H512 and 8 to H256 (choice.CLUSTER_BATCHES)."""
    _, fits16 = _layer("LSTM", 512)  # 4 MB of R: two clusters of 16 CTAs, all of R in registers (one cluster fits too)
    cell = cell_for(fits16)
    plan = plan_kernel(fits16, cell, SM90A, "cluster")
    assert plan.branches[0].config.describe() == "cluster(batch_tile=1, clusters=2, ctas=16, registers=1, sync=1, warps=8)"
    _, small = _layer("LSTM", 256)  # all of R in registers takes 16 CTAs (8 would read half of it from shared memory)
    assert default_config("cluster", small, cell_for(small), SM90A)["ctas"] == 16
    auto = plan_kernel(small, cell_for(small), SM90A).branches
    assert auto[0].up_to == 1 and auto[0].config.kind == "cluster" and auto[0].config["sync"] == 1, auto[0]
    # 4 clusters of 16 and 8 of 8: within half the SMs, all resident at once
    assert [(b.up_to, b.config["batch_groups"], b.config["ctas"]) for b in auto[1:3]] == [(4, 4, 16), (8, 8, 8)], auto
    assert all(b.config.kind != "cluster" for b in auto[3:]) and auto[3].config.kind == "persistent_mma", auto[3]
    auto = plan_kernel(fits16, cell, SM90A).branches  # H512: 4 clusters of 16; 8 rows would need 8 of them
    assert [(b.up_to, b.config.kind, b.config["batch_groups"] if b.config.kind == "cluster" else 0) for b in auto[:3]] == \
        [(1, "cluster", 1), (4, "cluster", 4), (8, "persistent_mma", 0)], auto
    _, wide = _layer("LSTM", 1024)  # 16 MB of R: 4 clusters of 16 CTAs, 16 units and 96 KB of R in shared memory each
    assert plan_kernel(wide, cell_for(wide), SM90A, "cluster").branches[0].config.describe() == \
        "cluster(batch_tile=1, clusters=4, ctas=16, registers=1, sync=1, warps=8)"
    auto = plan_kernel(wide, cell_for(wide), SM90A).branches
    assert auto[0].up_to == 1 and auto[0].config["clusters"] == 4, auto[0]
    _, odd = _layer("GRU", 800, dtype="float16")  # one cluster fits, no grid of at most 24 units a CTA: not auto's
    assert plan_kernel(odd, cell_for(odd), SM90A).branches[0].config.kind == "persistent"
    _, big = _layer("LSTM", 2048)
    with pytest.raises(KernelError, match="kernel 'cluster' keeps R in thread-block clusters: R of one direction needs "
                                          "4112 KB of shared memory per CTA across a cluster of 16, and 912 KB across 4 clusters of 16"):
        plan_kernel(big, cell_for(big), SM90A, "cluster")
    with pytest.raises(KernelError, match="thread-block clusters need sm_90 or newer; the target is sm_80"):
        plan_kernel(small, cell_for(small), tvm.target.Target({"kind": "cuda", "arch": "sm_80"}), "cluster")


def test_every_point_of_the_space_fits():
    """The tuner may pick any point: each one valid (a lane per (unit, row), registers within budget) and within a
    CTA's shared memory; the default splits R between registers and shared memory."""
    import itertools

    from schedules.space import _cluster_config

    for op, hidden, dtype in LAYERS:
        _, spec = _layer(op, hidden, dtype=dtype)
        cell = cell_for(spec)
        if not fits(spec, cell, Device()):
            continue
        space = knob_space("cluster", spec, cell, SM90A)
        for values in itertools.product(*space.values()):
            cfg = _cluster_config(KernelConfig.of("cluster", **dict(zip(space, values))), spec)
            assert cfg.valid(spec) and cfg.smem_bytes(spec, cell) <= Device().smem_limit, (op, hidden, dtype, cfg)
    _, spec = _layer("LSTM", 256)
    assert default_config("cluster", spec, cell_for(spec), SM90A)["registers"] == 1


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_auto_dispatch_with_a_cluster_branch_builds(op):
    """Auto's batch-1 branch is the cluster kind, one branch of the batch dispatch: its barriers are all written
    (TVM's planner cannot insert one under the dispatch's condition), and the whole kernel builds through NVRTC."""
    from schedules import recurrent_kernel

    _, spec = _layer(op, 256, direction="bidirectional")
    assert plan_kernel(spec, cell_for(spec), SM90A).branches[0].config.kind == "cluster"
    kernel = recurrent_kernel(spec, cell_for(spec), SM90A, "auto")
    assert "barrier.cluster" in tvm.tirx.build(kernel.func, target=SM90A, pipeline=cooperative.register()).imports[0].inspect_source()
