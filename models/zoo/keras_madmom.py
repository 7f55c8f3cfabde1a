"""madmom's downbeat tracker network (downbeats_bgru_harmonic_0.pkl, madmom 0.16.1) as a Keras model.

madmom ships its networks as pickled numpy layers; its GRU is Keras' reset_after=True GRU (candidate
tanh(x W + b + r * (h R)), no recurrent bias) with the update gate's sense flipped (h = u * cell + (1 - u) * h_prev),
so Keras' z gate is madmom's update gate with its weights and bias negated. Its initial states are learned.
The check runs madmom's own layer code (madmom/ml/nn/layers.py, numpy only; loaded as models/zoo/madmom.py does).
"""

from __future__ import annotations

import numpy as np

from .madmom import load_network, madmom_forward

MODEL = "madmom/models/downbeats/2016/downbeats_bgru_harmonic_0.pkl"


def _keras_gru_weights(layer):
    """madmom GRULayer -> Keras GRU (reset_after=True) weights: kernel, recurrent kernel, bias [2, 3H]."""
    u, r, c = layer.update_gate, layer.reset_gate, layer.cell
    kernel = np.concatenate([-u.weights, r.weights, c.weights], axis=1)
    recurrent = np.concatenate([-u.recurrent_weights, r.recurrent_weights, c.recurrent_weights], axis=1)
    bias = np.stack([np.concatenate([-u.bias, r.bias, c.bias]), np.zeros(3 * c.bias.size, np.float32)])
    return [kernel.astype(np.float32), recurrent.astype(np.float32), bias.astype(np.float32)]


def build(package_dir, **_):
    import keras

    class LearnedInitialState(keras.layers.Layer):
        """A constant state broadcast over the batch of x."""

        def __init__(self, value, **kw):
            super().__init__(**kw)
            self.value = np.asarray(value, np.float32)

        def call(self, x):
            v = keras.ops.convert_to_tensor(self.value)[None]
            return keras.ops.broadcast_to(v, (keras.ops.shape(x)[0], self.value.size))

    net = load_network(package_dir, MODEL)
    x = keras.Input((None, net.layers[0].fwd_layer.cell.weights.shape[0]), name="features")
    out, grus = x, []
    for layer in net.layers[:-1]:
        hidden = layer.fwd_layer.cell.bias.size
        fwd = keras.layers.GRU(hidden, return_sequences=True)
        bwd = keras.layers.GRU(hidden, return_sequences=True, go_backwards=True)
        states = [LearnedInitialState(sub.init)(out) for sub in (layer.fwd_layer, layer.bwd_layer)]
        both = keras.layers.Bidirectional(fwd, backward_layer=bwd)
        out = both(out, initial_state=states)
        grus += [(both.forward_layer, layer.fwd_layer), (both.backward_layer, layer.bwd_layer)]
    head = net.layers[-1]
    dense = keras.layers.Dense(head.bias.size, activation="sigmoid", name="activations")
    out = dense(out)
    model = keras.Model(x, out)
    for keras_layer, madmom_layer in grus:
        keras_layer.set_weights(_keras_gru_weights(madmom_layer))
    dense.set_weights([head.weights, head.bias])
    return model


def check(model, package_dir, feeds, **_):
    """The Keras model against madmom's forward, sequence by sequence."""
    net = load_network(package_dir, MODEL)
    features = feeds["features"]
    ours = np.asarray(model(features))
    for b in range(features.shape[0]):
        want = madmom_forward(net, features[b])
        np.testing.assert_allclose(ours[b], want, rtol=1e-4, atol=1e-5, err_msg="Keras rebuild vs madmom")
