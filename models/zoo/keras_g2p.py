"""g2p-en's grapheme-to-phoneme GRU encoder-decoder (checkpoint20.npz, g2p-en 2.1.0) as a Keras model, teacher-forced.

g2p-en ships PyTorch-layout GRU weights (gates r, z, n; w_ih [3H, I], w_hh [3H, H], biases b_ih, b_hh) and runs them
in numpy with n = tanh(x W_n + b_in + r * (h R_n + b_hn)): Keras' reset_after=True GRU with its gates reordered to
z, r, h and its bias rows (input, recurrent). The graph takes the graphemes and the phonemes decoded so far and gives
the next phoneme's logits at every step (greedy decoding calls it once per phoneme).
The check runs g2p-en's own numpy GRU code (G2p.gru and G2p.grucell, taken from g2p_en/g2p.py).
"""

from __future__ import annotations

import ast
import os

import numpy as np

_TORCH_TO_KERAS = [1, 0, 2]  # gate blocks r, z, n -> z, r, h


def _weights(package_dir):
    return dict(np.load(os.path.join(package_dir, "g2p_en", "checkpoint20.npz")))


def _keras_gru_weights(w_ih, w_hh, b_ih, b_hh):
    def reorder(m):
        blocks = np.split(m, 3, axis=0)
        return np.concatenate([blocks[i] for i in _TORCH_TO_KERAS], axis=0)

    return [reorder(w_ih).T, reorder(w_hh).T, np.stack([reorder(b_ih), reorder(b_hh)])]


def build(package_dir, reset_after=True):
    import keras

    w = _weights(package_dir)
    graphemes = keras.Input((None,), dtype="int64", name="graphemes")
    phonemes = keras.Input((None,), dtype="int64", name="phonemes")
    enc_emb = keras.layers.Embedding(*w["enc_emb"].shape)
    dec_emb = keras.layers.Embedding(*w["dec_emb"].shape)
    hidden = w["enc_w_hh"].shape[1]
    encoder = keras.layers.GRU(hidden, return_state=True, reset_after=reset_after)
    decoder = keras.layers.GRU(hidden, return_sequences=True, reset_after=reset_after)
    head = keras.layers.Dense(w["fc_b"].size, name="logits")
    _, state = encoder(enc_emb(graphemes))
    logits = head(decoder(dec_emb(phonemes), initial_state=state))
    model = keras.Model([graphemes, phonemes], logits)
    enc_emb.set_weights([w["enc_emb"]])
    dec_emb.set_weights([w["dec_emb"]])
    for layer, part in ((encoder, "enc"), (decoder, "dec")):
        weights = _keras_gru_weights(*(w[f"{part}_{k}"] for k in ("w_ih", "w_hh", "b_ih", "b_hh")))
        if not reset_after:  # one bias vector: the recurrent one folded in (exact for z and r, not for the candidate)
            weights = weights[:2] + [weights[2][0] + weights[2][1]]
        layer.set_weights(weights)
    head.set_weights([w["fc_w"].T, w["fc_b"]])
    return model


def _g2p_gru_code(package_dir):
    """G2p's own sigmoid, grucell and gru methods, taken from g2p_en/g2p.py's source (its module, when imported,
    downloads nltk corpora; these methods use numpy alone)."""
    with open(os.path.join(package_dir, "g2p_en", "g2p.py")) as f:
        tree = ast.parse(f.read())
    g2p = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "G2p")
    methods = [n for n in g2p.body if isinstance(n, ast.FunctionDef) and n.name in ("sigmoid", "grucell", "gru")]
    namespace = {"np": np}
    g2p.body, g2p.decorator_list = methods, []
    module = ast.fix_missing_locations(ast.Module([g2p], []))
    exec(compile(module, "g2p_en/g2p.py", "exec"), namespace)  # noqa: S102 - the package's own source
    return namespace["G2p"]()


def g2p_forward(package_dir, graphemes, phonemes):
    """Teacher-forced logits by g2p-en's own numpy GRU code."""
    g, w = _g2p_gru_code(package_dir), _weights(package_dir)
    enc = g.gru(np.take(w["enc_emb"], graphemes, axis=0), graphemes.shape[1], w["enc_w_ih"], w["enc_w_hh"],
                w["enc_b_ih"], w["enc_b_hh"], h0=np.zeros((graphemes.shape[0], w["enc_w_hh"].shape[-1]), np.float32))
    dec = g.gru(np.take(w["dec_emb"], phonemes, axis=0), phonemes.shape[1], w["dec_w_ih"], w["dec_w_hh"],
                w["dec_b_ih"], w["dec_b_hh"], h0=enc[:, -1, :])
    return np.matmul(dec, w["fc_w"].T) + w["fc_b"]


def check(model, package_dir, feeds, reset_after=True):
    """The Keras model against g2p-en's numpy forward (the reset_after=False variant computes another function)."""
    if not reset_after:
        return
    ours = np.asarray(model([feeds["graphemes"], feeds["phonemes"]]))
    want = g2p_forward(package_dir, feeds["graphemes"], feeds["phonemes"])
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4, err_msg="Keras rebuild vs g2p-en")
