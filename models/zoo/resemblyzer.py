"""Resemblyzer's speaker encoder (PyPI Resemblyzer 0.1.4, weights pretrained.pt in the wheel): a 3-layer LSTM of 256
over 40-band mel frames, the last layer's final state through Linear + ReLU, L2-normalized. Rebuilt in torch from the
state dict (the package's own module needs webrtcvad and librosa) and exported with both torch exporters."""

from __future__ import annotations

import numpy as np

from .fetch import cached_onnx, package_dir

PACKAGE, VERSION = "Resemblyzer", "0.1.4"
MELS, FRAMES = 40, 160  # the package's partial utterance: 160 frames of 10 ms


def encoder():
    import torch
    from torch import nn

    class SpeakerEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(MELS, 256, 3, batch_first=True)
            self.linear = nn.Linear(256, 256)

        def forward(self, mels):
            _, (hidden, _) = self.lstm(mels)
            embeds = torch.relu(self.linear(hidden[-1]))
            return embeds / torch.norm(embeds, dim=1, keepdim=True)

    state = torch.load(package_dir(PACKAGE, VERSION) / "resemblyzer" / "pretrained.pt", map_location="cpu")["model_state"]
    model = SpeakerEncoder()
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("similarity_")})
    return model.eval()


def build(exporter: str):
    import torch

    from .export import export

    example = torch.rand(2, FRAMES, MELS)
    return cached_onnx(f"resemblyzer_{exporter}", lambda path: export(
        encoder(), (example,), path, exporter, ["mels"], ["embedding"], {"mels": {0: "batch", 1: "frames"}}))


def feeds(rng):
    """Log-mel-like frames in [0, 1] (the package feeds normalized mels): 2 partial utterances."""
    return [{"mels": rng.random((2, FRAMES, MELS), dtype=np.float32)}]
