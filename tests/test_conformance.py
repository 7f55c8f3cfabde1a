"""Every supported LSTM/GRU/RNN configuration matches ONNX Runtime and the float64 reference (CPU target).

A hypothesis sweep draws op, attributes, optional inputs, outputs and shapes; each drawn
model is compiled once and run at two (seq, batch) shapes, since one module must serve any.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvmrnn
from onnx_cases import Case, from_layout0, to_layout0

RTOL, ATOL = 1e-4, 1e-5
OPTIONAL = {"LSTM": ("B", "sequence_lens", "initial_h", "initial_c", "P"), "GRU": ("B", "sequence_lens", "initial_h"),
            "RNN": ("B", "sequence_lens", "initial_h")}
# (name, takes alpha, takes beta); values drawn small so no activation saturates everything
ACTS = [("Relu", 0, 0), ("Tanh", 0, 0), ("Sigmoid", 0, 0), ("Affine", 1, 1), ("LeakyRelu", 1, 0), ("ThresholdedRelu", 1, 0),
        ("ScaledTanh", 1, 1), ("HardSigmoid", 1, 1), ("Elu", 1, 0), ("Softsign", 0, 0), ("Softplus", 0, 0)]


def ort_outputs(case: Case, feeds: dict) -> dict:
    twin = case.twin() if case.layout else case
    sess = ort.InferenceSession(twin.model().SerializeToString(), providers=["CPUExecutionProvider"])
    ins = to_layout0(feeds) if case.layout else feeds
    names = [o for o in case.output_names if o]
    res = dict(zip(names, sess.run(names, ins)))
    return {k: from_layout0(k, v) for k, v in res.items()} if case.layout else res


OVERFLOW = 1e30  # float64 reference magnitudes beyond this overflow float32 within a step or two


def check_case(case: Case, shapes=((5, 3), (2, 1)), seed=0):
    module = tvmrnn.compile(case.model(), target="llvm")
    rng = np.random.default_rng(seed)
    for T, N in shapes:
        feeds = case.feeds(rng, T, N)
        ours = module.run(feeds)
        expected_ort, expected_ref = ort_outputs(case, feeds), case.reference(feeds)
        assert sorted(ours) == sorted(expected_ort), "output names differ"
        for name, value in ours.items():
            # unbounded gate activations (Softplus, Relu...) can overflow float32 in a few steps; past
            # that point inf vs nan depends on the order of operations, so such elements are not compared.
            # ONNX Runtime's Softplus is log(1 + exp(x)), which overflows where ours (and the float64
            # reference) does not: where it gives a non-finite value against a finite reference, only
            # the reference is compared (seen: a GRU with Softplus gates, ORT nan, ours = reference = -29869.4).
            ok = np.abs(expected_ref[name]) < OVERFLOW
            assert ok.mean() > 0.5, "the case overflows float32 almost everywhere: it tests nothing"
            ort_ok = ok & np.isfinite(expected_ort[name])
            np.testing.assert_allclose(value[ort_ok], expected_ort[name][ort_ok], rtol=RTOL, atol=ATOL, err_msg=f"{name} vs ONNX Runtime at T={T} N={N}")
            np.testing.assert_allclose(value[ok], expected_ref[name][ok], rtol=RTOL, atol=ATOL, err_msg=f"{name} vs reference at T={T} N={N}")


@st.composite
def cases(draw, op):
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    D = 2 if direction == "bidirectional" else 1
    layout = draw(st.sampled_from([0, 1]))
    opset = draw(st.sampled_from([14, 22] if layout else [7, 14, 22]))
    optional = tuple(o for o in OPTIONAL[op] if draw(st.booleans()))
    n_out = 3 if op == "LSTM" else 2
    outputs = tuple(draw(st.sampled_from(["", name])) for name in ("Y", "Y_h", "Y_c")[:n_out])
    if not any(outputs):
        outputs = ("Y",) + outputs[1:]
    while outputs and outputs[-1] == "":
        outputs = outputs[:-1]  # ONNX drops trailing unnamed outputs
    activations = alpha = beta = None
    if draw(st.booleans()):
        per_dir = {"LSTM": 3, "GRU": 2, "RNN": 1}[op]
        chosen = [draw(st.sampled_from(ACTS)) for _ in range(per_dir * D)]
        activations = tuple(a[0] for a in chosen)
        small = st.floats(0.1, 1.0).map(lambda v: round(v, 3))
        alpha = tuple(draw(small) for a in chosen if a[1]) or None
        beta = tuple(draw(small) for a in chosen if a[2]) or None
        # ONNX Runtime fills missing values with its own defaults; give all or none
    clip = draw(st.sampled_from([None, None, 0.5, 3.0]))
    return Case(op=op, hidden=draw(st.integers(1, 20)), input_size=draw(st.integers(1, 12)), direction=direction,
                layout=layout, optional=optional, outputs=outputs, activations=activations, activation_alpha=alpha,
                activation_beta=beta, clip=clip, input_forget=int(op == "LSTM" and draw(st.booleans())),
                linear_before_reset=int(op == "GRU" and draw(st.booleans())), weights_as_inputs=draw(st.booleans()),
                opset=opset, seed=draw(st.integers(0, 2**16)))


def _sweep(op: str):
    """20 drawn layers of `op` against ONNX Runtime. derandomize: CI runs the same examples every time (a failure
    reproduces; new ones come with code changes). A test function of its own per op (hypothesis ties a test to the
    class that runs it), each in its own class: `--dist loadscope` spreads classes over the workers."""

    @pytest.mark.slow
    @settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data(), shapes=st.tuples(st.integers(1, 7), st.integers(1, 4)))
    def test_sweep_matches_onnxruntime(self, data, shapes):
        check_case(data.draw(cases(op)), shapes=(shapes, (3, 2)))

    return test_sweep_matches_onnxruntime


class TestSweepLSTM:
    test_sweep_matches_onnxruntime = _sweep("LSTM")


class TestSweepGRU:
    test_sweep_matches_onnxruntime = _sweep("GRU")


class TestSweepRNN:
    test_sweep_matches_onnxruntime = _sweep("RNN")


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", pytest.param("reverse", marks=pytest.mark.slow), "bidirectional"])
@pytest.mark.parametrize("layout", [0, pytest.param(1, marks=pytest.mark.slow)])  # layout 1 also in test_kernels' CASES
def test_every_optional_input(op, direction, layout):
    """The fixed corners the sweep may miss: every optional input at once, both layouts, all directions."""
    check_case(Case(op=op, direction=direction, layout=layout, optional=OPTIONAL[op], hidden=16, input_size=7,
                    linear_before_reset=1 if op == "GRU" else 0))


def test_lstm_input_forget_peepholes_clip():
    check_case(Case(op="LSTM", direction="bidirectional", optional=OPTIONAL["LSTM"], input_forget=1, clip=0.7))


def test_gru_reset_before_and_after():
    for lbr in (0, 1):
        check_case(Case(op="GRU", direction="bidirectional", optional=OPTIONAL["GRU"], linear_before_reset=lbr, clip=2.0))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float16_model(op):
    """An fp16 ONNX model imports as fp16 (fp32 arithmetic inside) and matches the float64 reference to 1e-2."""
    case = Case(op=op, direction="bidirectional", optional=OPTIONAL[op], hidden=24, input_size=9, dtype="float16")
    module = tvmrnn.compile(case.model(), target="llvm")
    feeds = case.feeds(np.random.default_rng(1), 6, 3)
    ours, ref = module.run(feeds), case.reference(feeds)
    for name, value in ours.items():
        assert value.dtype == np.float16
        np.testing.assert_allclose(value.astype("f8"), ref[name], rtol=1e-2, atol=1e-2, err_msg=name)


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_fp32_model_in_half_storage(storage):
    case = Case(op="LSTM", direction="bidirectional", optional=OPTIONAL["LSTM"], hidden=24, input_size=9)
    module = tvmrnn.compile(case.model(), target="llvm", dtype=storage)
    assert module.metadata["layers"][0]["dtype"] == storage
    feeds = case.feeds(np.random.default_rng(2), 6, 3)
    ours, ref = module.run(feeds), case.reference(feeds)
    tol = 1e-2 if storage == "float16" else 3e-2  # bf16 keeps 8 bits of mantissa
    for name, value in ours.items():
        assert value.dtype == np.float32
        np.testing.assert_allclose(value, ref[name], rtol=tol, atol=tol, err_msg=name)


def test_softplus_gates_where_onnxruntime_overflows():
    # found by the sweep: ORT's log(1 + exp(x)) gives nan at step 5 where ours equals the float64 reference
    check_case(Case(op="GRU", hidden=6, input_size=6, optional=("initial_h",), outputs=("Y",),
                    activations=("Softplus", "Sigmoid"), opset=7, seed=3773), shapes=((5, 3), (3, 2)))
