"""g2p-en's grapheme-to-phoneme seq2seq (PyPI g2p-en 2.1.0, weights checkpoint20.npz in the wheel): a GRU encoder of
256 over letters, a GRU decoder of 256 over phonemes started from the encoder's final state, and a dense head over
74 phonemes. The package runs it in numpy (its GRU cell is torch's: gates r, z, n); here the same weights go into a
torch module, decoded with teacher forcing (the package's greedy loop feeds back the argmax one step at a time)."""

from __future__ import annotations

import numpy as np

from .fetch import cached_onnx, package_dir

PACKAGE, VERSION = "g2p-en", "2.1.0"
LETTERS, PHONEMES, HIDDEN = 29, 74, 256


def seq2seq():
    import torch
    from torch import nn

    class G2P(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc_emb, self.dec_emb = nn.Embedding(LETTERS, HIDDEN), nn.Embedding(PHONEMES, HIDDEN)
            self.encoder = nn.GRU(HIDDEN, HIDDEN, batch_first=True)
            self.decoder = nn.GRU(HIDDEN, HIDDEN, batch_first=True)
            self.fc = nn.Linear(HIDDEN, PHONEMES)

        def forward(self, letters, phonemes):
            _, h = self.encoder(self.enc_emb(letters))
            y, _ = self.decoder(self.dec_emb(phonemes), h)
            return self.fc(y)

    w = np.load(package_dir(PACKAGE, VERSION) / "g2p_en" / "checkpoint20.npz")
    model = G2P()
    names = {"enc_emb.weight": "enc_emb", "dec_emb.weight": "dec_emb", "fc.weight": "fc_w", "fc.bias": "fc_b"}
    for part in ("enc", "dec"):
        for torch_name, ours in (("weight_ih_l0", "w_ih"), ("weight_hh_l0", "w_hh"), ("bias_ih_l0", "b_ih"), ("bias_hh_l0", "b_hh")):
            names[f"{'encoder' if part == 'enc' else 'decoder'}.{torch_name}"] = f"{part}_{ours}"
    model.load_state_dict({k: torch.from_numpy(w[v]) for k, v in names.items()})
    return model.eval()


def build(exporter: str):
    import torch

    from .export import export

    example = (torch.randint(0, LETTERS, (2, 9)), torch.randint(0, PHONEMES, (2, 7)))
    dims = {"letters": {0: "batch", 1: "letters_len"}, "phonemes": {0: "batch", 1: "phonemes_len"}}
    return cached_onnx(f"g2p_en_{exporter}", lambda path: export(seq2seq(), example, path, exporter,
                                                                 ["letters", "phonemes"], ["logits"], dims))


def feeds(rng):
    """A batch of 3 words of 8 letters (ids 4.. are letters; 3 is </s>) and 10 phoneme steps (2 is <s>)."""
    letters = np.concatenate([rng.integers(4, LETTERS, (3, 8)), np.full((3, 1), 3)], axis=1)
    phonemes = np.concatenate([np.full((3, 1), 2), rng.integers(4, PHONEMES, (3, 9))], axis=1)
    return [{"letters": letters.astype(np.int64), "phonemes": phonemes.astype(np.int64)}]
