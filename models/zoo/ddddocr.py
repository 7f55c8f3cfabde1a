"""ddddocr's captcha recognizer (PyPI ddddocr 1.6.1, common.onnx in the wheel, exported from torch 1.9): a conv
net over a 64-pixel-high grayscale image, an LSTM over its columns and a dense head over the character set."""

from __future__ import annotations

import shutil

import numpy as np

from .fetch import model_path, wheel_dir

PACKAGE, VERSION = "ddddocr", "1.6.1"
WIDTH = 160  # a captcha resized to height 64


def build():
    path = model_path("ddddocr")
    if not path.exists():
        shutil.copyfile(wheel_dir(PACKAGE, VERSION) / "ddddocr" / "common.onnx", path)
    return path


def feeds(rng):
    """A captcha-sized image (the package resizes to height 64 and scales pixels to [-1, 1])."""
    return [{"input1": (rng.random((1, 1, 64, WIDTH), dtype=np.float32) * 2 - 1)}]
