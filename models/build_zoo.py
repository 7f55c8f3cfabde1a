"""Build the tvmrnn example zoo: small, realistic ONNX recurrent models with seeded weights.

    python models/build_zoo.py [--out DIR]      # default DIR: the folder of this script

Four models come from torch.onnx.export (legacy TorchScript exporter, opset 17, which emits real
ONNX LSTM/GRU nodes), two are written by hand with onnx.helper (opset 17).  Rebuilding gives
byte-identical files.  Every model is checked after writing: onnx.checker, the expected RNN ops,
input/output names and dynamic dims, one onnxruntime run at shapes other than the traced ones,
and (torch models) agreement with PyTorch.  ONNX Runtime cannot run layout=1 (batch-first) RNN
nodes, so `lstm_classifier_bf` is run in ORT through `to_layout0` and compared with
onnx.reference on the original graph.

Tests load this file by path (it imports only numpy at module level):
    spec = importlib.util.spec_from_file_location("build_zoo", "models/build_zoo.py")
    zoo = importlib.util.module_from_spec(spec); spec.loader.exec_module(zoo)
    feed = zoo.example_inputs("kws_gru", batch=2, time=16, seed=0)   # {"mfcc": float32 [2,16,40]}
"""
import argparse
import hashlib
import os
import warnings
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 17
VOCAB = 1000  # lstm_lm vocabulary; int64 inputs are token ids in [0, VOCAB)


@dataclass(frozen=True)
class ZooModel:
    name: str          # also the builder: build_<name>(path)
    filename: str
    description: str
    inputs: dict       # input name -> (numpy dtype name, shape); str dims are dynamic ("batch", "time", "seq")
    outputs: dict      # output name -> shape
    rnn_ops: tuple     # RNN op types the graph must contain, with multiplicity
    ort: bool = True   # False: onnxruntime cannot run it as is (layout=1)


ZOO = [
    ZooModel("ds2_small", "ds2_small.onnx", "DeepSpeech2-style: Conv1d+ReLU front end, 2-layer BiGRU(64), Linear(29), log_softmax",
             {"spectrogram": ("float32", ("batch", "time", 40))}, {"logits": ("batch", "time", 29)}, ("GRU", "GRU")),
    ZooModel("lstm_lm", "lstm_lm.onnx", "LSTM language model: Embedding(1000,64), 2-layer LSTM(128), Linear(1000), softmax",
             {"tokens": ("int64", ("seq", "batch"))}, {"probs": ("seq", "batch", VOCAB)}, ("LSTM", "LSTM")),
    ZooModel("lstm_classifier_bf", "lstm_classifier_bf.onnx", "batch-first classifier: LSTM(48) layout=1, Y_h, Flatten, Gemm(5), Softmax (onnx.helper)",
             {"features": ("float32", ("batch", "seq", 32))}, {"class_probs": ("batch", 5)}, ("LSTM",), ort=False),
    ZooModel("kws_gru", "kws_gru.onnx", "keyword spotting: GRU(40,64, batch_first), last hidden state, Linear(12)",
             {"mfcc": ("float32", ("batch", "time", 40))}, {"keyword_logits": ("batch", 12)}, ("GRU",)),
    ZooModel("streaming_lstm", "streaming_lstm.onnx", "stateful streaming LSTM(40,96): state in, state out",
             {"chunk": ("float32", ("time", "batch", 40)), "h_in": ("float32", (1, "batch", 96)), "c_in": ("float32", (1, "batch", 96))},
             {"out": ("time", "batch", 96), "h_out": (1, "batch", 96), "c_out": (1, "batch", 96)}, ("LSTM",)),
    ZooModel("rnn_forecast", "rnn_forecast.onnx", "forecaster: bidirectional RNN(32, tanh) with sequence_lens, Y_h, MatMul+Add head to 4 steps (onnx.helper)",
             {"series": ("float32", ("seq", "batch", 8)), "lengths": ("int32", ("batch",))}, {"forecast": ("batch", 4)}, ("RNN",)),
]
BY_NAME = {m.name: m for m in ZOO}


def get(name):
    """ZooModel by name or file name ("kws_gru" or "kws_gru.onnx")."""
    return BY_NAME[os.path.basename(name).removesuffix(".onnx")]


def concrete_shape(shape, batch, time):
    return tuple(batch if d == "batch" else time if d in ("time", "seq") else d for d in shape)


def example_inputs(name, batch=2, time=16, seed=0):
    """Feed dict of numpy arrays: floats ~ N(0,1); int64 token ids in [0, VOCAB);
    int32 sequence lengths in [1, time] with lengths[0] == time."""
    rng, feed = np.random.default_rng(seed), {}
    for key, (dtype, shape) in get(name).inputs.items():
        shape = concrete_shape(shape, batch, time)
        if dtype == "int64":
            feed[key] = rng.integers(0, VOCAB, shape, dtype=np.int64)
        elif dtype == "int32":
            feed[key] = rng.integers(1, time + 1, shape, dtype=np.int32)
            feed[key][0] = time
        else:
            feed[key] = rng.standard_normal(shape, dtype=np.float32)
    return feed


# ----------------------------------------------------------------------------- torch models
def _torch_export(module, name, path):
    """Export with the legacy exporter, tracing at batch=3/time=7; return a feed -> outputs function."""
    import torch
    m, spec = module.eval(), get(name)
    args = tuple(torch.from_numpy(a) for a in example_inputs(name, batch=3, time=7, seed=1).values())
    axes = {k: {i: d for i, d in enumerate(s[-1]) if isinstance(d, str)} for k, s in spec.inputs.items()}
    axes.update({k: {i: d for i, d in enumerate(s) if isinstance(d, str)} for k, s in spec.outputs.items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, args, path, dynamo=False, opset_version=OPSET, input_names=list(spec.inputs),
                          output_names=list(spec.outputs), dynamic_axes=axes, do_constant_folding=True)

    def run(feed):
        with torch.no_grad():
            out = m(*(torch.from_numpy(feed[k]) for k in spec.inputs))
        return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
    return run


def build_ds2_small(path):
    import torch
    from torch import nn
    torch.manual_seed(0)

    class DS2(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(40, 64, kernel_size=11, padding=5)
            self.gru = nn.GRU(64, 64, num_layers=2, bidirectional=True)
            self.fc = nn.Linear(128, 29)

        def forward(self, x):                                       # [B, T, 40]
            x = torch.relu(self.conv(x.transpose(1, 2)))            # [B, 64, T]
            y, _ = self.gru(x.permute(2, 0, 1))                     # [T, B, 128]
            return torch.log_softmax(self.fc(y), -1).transpose(0, 1)  # [B, T, 29]
    return _torch_export(DS2(), "ds2_small", path)


def build_lstm_lm(path):
    import torch
    from torch import nn
    torch.manual_seed(0)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lstm, self.fc = nn.Embedding(VOCAB, 64), nn.LSTM(64, 128, num_layers=2), nn.Linear(128, VOCAB)

        def forward(self, tokens):                                  # [S, B]
            return torch.softmax(self.fc(self.lstm(self.emb(tokens))[0]), -1)
    return _torch_export(LM(), "lstm_lm", path)


def build_kws_gru(path):
    import torch
    from torch import nn
    torch.manual_seed(0)

    class KWS(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru, self.fc = nn.GRU(40, 64, batch_first=True), nn.Linear(64, 12)

        def forward(self, x):                                       # [B, T, 40]
            return self.fc(self.gru(x)[1][-1])
    return _torch_export(KWS(), "kws_gru", path)


def build_streaming_lstm(path):
    import torch
    from torch import nn
    torch.manual_seed(0)

    class Streaming(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(40, 96)

        def forward(self, chunk, h, c):
            y, (h, c) = self.lstm(chunk, (h, c))
            return y, h, c
    return _torch_export(Streaming(), "streaming_lstm", path)


# ----------------------------------------------------------------------------- onnx.helper models
def _helper_model(name, nodes, inits, path):
    from onnx import TensorProto, helper, numpy_helper, save
    spec, T = get(name), {"float32": TensorProto.FLOAT, "int32": TensorProto.INT32, "int64": TensorProto.INT64}
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(k, T[d], s) for k, (d, s) in spec.inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in spec.outputs.items()],
        [numpy_helper.from_array(v.astype(np.float32) if v.dtype == np.float64 else v, k) for k, v in inits.items()])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8,
                           producer_name="tvmrnn-build_zoo"), path)


def _uniform(rng, shape, fan):
    return rng.uniform(-fan ** -0.5, fan ** -0.5, shape).astype(np.float32)  # torch's default RNN/Linear init


def build_lstm_classifier_bf(path):
    from onnx import helper
    rng, H = np.random.default_rng(0), 48
    inits = {"W": _uniform(rng, (1, 4 * H, 32), H), "R": _uniform(rng, (1, 4 * H, H), H), "B": _uniform(rng, (1, 8 * H), H),
             "fc_w": _uniform(rng, (5, H), H), "fc_b": _uniform(rng, (5,), H)}
    nodes = [helper.make_node("LSTM", ["features", "W", "R", "B"], ["", "Y_h"], hidden_size=H, layout=1),  # Y_h: [B, 1, H]
             helper.make_node("Flatten", ["Y_h"], ["h"], axis=1),
             helper.make_node("Gemm", ["h", "fc_w", "fc_b"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["class_probs"], axis=-1)]
    _helper_model("lstm_classifier_bf", nodes, inits, path)


def build_rnn_forecast(path):
    from onnx import helper
    rng, H = np.random.default_rng(0), 32
    inits = {"W": _uniform(rng, (2, H, 8), H), "R": _uniform(rng, (2, H, H), H), "B": _uniform(rng, (2, 2 * H), H),
             "head_w": _uniform(rng, (2 * H, 4), 2 * H), "head_b": _uniform(rng, (4,), 2 * H),
             "flat": np.array([0, -1], np.int64)}
    nodes = [helper.make_node("RNN", ["series", "W", "R", "B", "lengths"], ["", "Y_h"], hidden_size=H, direction="bidirectional"),
             helper.make_node("Transpose", ["Y_h"], ["h_t"], perm=[1, 0, 2]),   # [B, 2, H]
             helper.make_node("Reshape", ["h_t", "flat"], ["h"]),               # [B, 2H]
             helper.make_node("MatMul", ["h", "head_w"], ["y"]),
             helper.make_node("Add", ["y", "head_b"], ["forecast"])]
    _helper_model("rnn_forecast", nodes, inits, path)


def to_layout0(model):
    """Copy of `model` with each layout=1 LSTM/GRU/RNN rewritten as Transpose + layout=0 node + Transpose
    (same semantics), which onnxruntime can run."""
    from onnx import ModelProto, helper
    copy, nodes = ModelProto(), []
    copy.CopyFrom(model)
    model = copy
    for n in model.graph.node:
        layout = next((a for a in n.attribute if a.name == "layout"), None)
        if n.op_type not in ("LSTM", "GRU", "RNN") or layout is None or layout.i == 0:
            nodes.append(n)
            continue
        layout.i, ins, outs = 0, list(n.input), list(n.output)
        for i in (0, 5, 6):  # X, initial_h, initial_c
            if i < len(ins) and ins[i]:
                nodes.append(helper.make_node("Transpose", [ins[i]], [ins[i] + "__l0"], perm=[1, 0, 2]))
                ins[i] += "__l0"
        n.input[:] = ins
        nodes.append(n)
        for i, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):  # Y, Y_h, Y_c
            if i < len(outs) and outs[i]:
                n.output[i] = outs[i] + "__l0"
                nodes.append(helper.make_node("Transpose", [n.output[i]], [outs[i]], perm=perm))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


# ----------------------------------------------------------------------------- build + verify
def _dims(vi):
    return tuple(d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim)


def build_and_check(spec, out_dir, batch=2, time=16):
    import onnx
    import onnxruntime as ort
    path = os.path.join(out_dir, spec.filename)
    torch_run = globals()["build_" + spec.name](path)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    rnn = tuple(op for op in ops if op in ("LSTM", "GRU", "RNN"))
    assert rnn == spec.rnn_ops, (spec.name, ops)
    assert {i.name: _dims(i) for i in model.graph.input} == {k: s for k, (_, s) in spec.inputs.items()}, spec.name
    assert {o.name: _dims(o) for o in model.graph.output} == spec.outputs, spec.name
    feed = example_inputs(spec.name, batch, time)
    want = [concrete_shape(s, batch, time) for s in spec.outputs.values()]
    if spec.ort:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(None, feed)
        note = ""
    else:  # ORT rejects layout=1; run the layout=0 rewrite in ORT and check it against onnx.reference
        from onnx.reference import ReferenceEvaluator
        sess = ort.InferenceSession(to_layout0(model).SerializeToString(), providers=["CPUExecutionProvider"])
        got, ref = sess.run(None, feed), ReferenceEvaluator(model).run(None, feed)
        assert all(np.allclose(g, r, atol=1e-5) for g, r in zip(got, ref)), spec.name
        note = "  [ORT cannot run layout=1: ran to_layout0() in ORT, matches onnx.reference on the original]"
    assert [g.shape for g in got] == want, (spec.name, [g.shape for g in got], want)
    err = max(float(np.abs(g - t).max()) for g, t in zip(got, torch_run(feed))) if torch_run else None
    print(f"  {spec.name}: ORT outputs {dict(zip(spec.outputs, [g.shape for g in got]))}"
          + (f", max |ORT - torch| = {err:.1e}" if err is not None else "") + note)
    assert err is None or err < 1e-4, (spec.name, err)
    size = os.path.getsize(path)
    assert size < 2 << 20, (spec.name, size)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()[:12]
    return f"{spec.filename:26s} {size / 1024:7.1f} KB  rnn ops: {' '.join(rnn):10s} sha256 {sha}  ({len(ops)} nodes)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=HERE, help="output folder (default: next to this script)")
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    summary = []
    for spec in ZOO:
        print(f"building {spec.filename}: {spec.description}")
        summary.append(build_and_check(spec, out))
    print("\n".join(["", f"zoo in {out}:"] + summary))


if __name__ == "__main__":
    main()
