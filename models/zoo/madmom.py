"""madmom's online onset detector (PyPI madmom 0.16.1, onsets/2013/onsets_rnn_1.pkl in its sdist): three tanh RNN
layers of 25 over 236 spectral features at 100 frames/s and a sigmoid unit. It is unidirectional so that madmom runs it
online, frame by frame, the layers' state carried; here it streams chunks of CHUNK frames the same way.

madmom ships its networks as pickled numpy layers (madmom.ml.nn); they load here without madmom's compiled part,
which is neither needed nor built (keras_madmom loads its downbeat tracker so too). The onset network is rebuilt as
torch's nn.RNN (madmom's RecurrentLayer is torch's RNN cell without the recurrent bias) and checked against madmom's
own stateful layer code before it is exported. The legacy exporter writes ONNX RNN nodes (frames symbolic); dynamo
unrolls nn.RNN over the traced chunk (CHUNK frames, fixed).
"""

from __future__ import annotations

import importlib.util
import pickle
import sys
import types
import warnings

import numpy as np

from . import silero_vad
from .fetch import cached_onnx, package_dir

PACKAGE, VERSION = "madmom", "0.16.1"
ONSETS = "madmom/models/onsets/2013/onsets_rnn_1.pkl"
FEATURES, HIDDEN, LAYERS = 236, 25, 3
CHUNK, CHUNKS = 10, 6  # 100 ms of frames per streamed chunk, chunks per test stream


def _madmom_layers(root):
    """madmom.ml.nn.layers and .activations loaded from the sdist alone (the package __init__ needs compiled code)."""
    nn_dir = root / "madmom" / "ml" / "nn"
    saved = {k: sys.modules.get(k) for k in ("madmom", "madmom.ml", "madmom.ml.nn")}
    for name in saved:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["madmom.ml.nn"].__path__ = [str(nn_dir)]
    try:
        mods = {}
        for part in ("activations", "layers"):
            spec = importlib.util.spec_from_file_location(f"madmom.ml.nn.{part}", nn_dir / f"{part}.py")
            mods[part] = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mods[part]
            spec.loader.exec_module(mods[part])
        return mods
    finally:
        for name, mod in saved.items():
            sys.modules.pop(name) if mod is None else sys.modules.__setitem__(name, mod)


class _Network:
    """madmom.ml.nn.NeuralNetwork's data (its class is a Processor from madmom's compiled part)."""

    def __setstate__(self, state):
        self.__dict__.update(state)


def load_network(root, model: str):
    """The pickled network madmom/models/... of the unpacked sdist at root, its layers madmom's own classes."""
    mods = _madmom_layers(root)

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if module == "madmom.ml.nn" and name == "NeuralNetwork":
                return _Network
            if module.startswith("madmom.ml.nn."):
                return getattr(mods[module.rsplit(".", 1)[1]], name)
            return super().find_class(module, name)

    with open(root / model, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # madmom asks to re-save its own old GRU pickles
        return Unpickler(f, encoding="latin1").load()


def madmom_forward(net, features, reset=True):
    """madmom's own forward pass of one sequence [T, F]; reset=False goes on from the state the last call left."""
    out = features
    for layer in net.layers:
        out = layer.activate(out, reset=reset) if hasattr(layer, "reset") else layer(out)
    return out


def onset_rnn(net):
    import torch
    from torch import nn

    class OnsetRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.RNN(FEATURES, HIDDEN, LAYERS, batch_first=True)
            self.head = nn.Linear(HIDDEN, 1)

        def forward(self, frames, state):
            hidden, state = self.rnn(frames, state)
            return torch.sigmoid(self.head(hidden)), state

    *recurrent, head = net.layers
    weights = {"head.weight": head.weights.T, "head.bias": head.bias}
    for i, layer in enumerate(recurrent):
        weights.update({f"rnn.weight_ih_l{i}": layer.weights.T, f"rnn.weight_hh_l{i}": layer.recurrent_weights.T,
                        f"rnn.bias_ih_l{i}": layer.bias, f"rnn.bias_hh_l{i}": np.zeros(HIDDEN)})
    model = OnsetRNN()
    model.load_state_dict({k: torch.tensor(np.asarray(v, np.float32)) for k, v in weights.items()})
    return model.eval()


def torch_module():
    return onset_rnn(load_network(package_dir(PACKAGE, VERSION), ONSETS))


def check(model, net, chunks):
    """The torch rebuild against madmom's online (stateful) forward, chunk by chunk from madmom's initial state."""
    import torch

    state = torch.tensor(np.stack([layer.init for layer in net.layers[:-1]])[:, None], dtype=torch.float32)
    for i, chunk in enumerate(chunks):
        with torch.no_grad():
            ours, state = model(torch.from_numpy(chunk[None]), state)
        want = madmom_forward(net, chunk, reset=i == 0)
        np.testing.assert_allclose(ours[0].numpy(), want, rtol=1e-4, atol=1e-5, err_msg=f"rebuild vs madmom, chunk {i}")


def build(exporter: str):
    import torch

    from .export import export

    def make(path):
        root = package_dir(PACKAGE, VERSION)
        net = load_network(root, ONSETS)
        model = onset_rnn(net)
        check(model, net, np.split(features(np.random.default_rng(1), CHUNKS * CHUNK), CHUNKS))
        example = (torch.rand(2, CHUNK, FEATURES), torch.zeros(LAYERS, 2, HIDDEN))
        export(model, example, path, exporter, ["frames", "state"], ["activations", "state_out"],
               {"frames": {0: "batch", 1: "frames"}, "state": {1: "batch"}})

    return cached_onnx(f"madmom_onsets_{exporter}", make)


def features(rng, frames: int) -> np.ndarray:
    """Onset-detector-like input [frames, 236] from speech-like audio at 100 frames/s: log magnitudes on 118 bands
    spaced logarithmically over 30 Hz-8 kHz and their positive differences from the previous frame (madmom's own are
    log-filtered spectrograms at three frame sizes with their positive differences; this is one of their kind)."""
    hop, size = 160, 1024
    audio = silero_vad.audio(rng, -(-(frames * hop + size) // silero_vad.CHUNK))
    windows = np.lib.stride_tricks.sliding_window_view(audio, size)[::hop][:frames] * np.hanning(size)
    magnitude = np.abs(np.fft.rfft(windows, axis=1))
    bins = np.fft.rfftfreq(size, 1 / 16000)
    bands = np.stack([np.interp(np.geomspace(30, 8000, FEATURES // 2), bins, m) for m in magnitude])
    spectrum = np.log10(1 + 5 * bands)
    rise = np.maximum(np.diff(spectrum, axis=0, prepend=spectrum[:1]), 0)
    return np.hstack([spectrum, rise]).astype(np.float32)


def feeds(rng):
    """One stream of CHUNKS chunks [1, CHUNK, 236]; the state [3, 1, 25] starts at madmom's (zeros)."""
    chunks = np.split(features(rng, CHUNKS * CHUNK), CHUNKS)
    return [{"frames": c[None], "state": np.zeros((LAYERS, 1, HIDDEN), np.float32)} for c in chunks]
