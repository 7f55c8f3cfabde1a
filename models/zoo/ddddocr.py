"""ddddocr's captcha recognizer (PyPI ddddocr 1.6.1, common.onnx in the wheel, exported from torch 1.9): a conv
net over a 64-pixel-high grayscale image, an LSTM over its columns and a dense head over the character set."""

from __future__ import annotations

import shutil

import numpy as np

from .fetch import cached_onnx, package_dir

PACKAGE, VERSION = "ddddocr", "1.6.1"
WIDTH = 160  # a captcha resized to height 64


def build():
    return cached_onnx("ddddocr", lambda path: shutil.copyfile(
        package_dir(PACKAGE, VERSION) / "ddddocr" / "common.onnx", path))


def feeds(rng):
    """A captcha-sized image (the package resizes to height 64 and scales pixels to [-1, 1])."""
    return [{"input1": (rng.random((1, 1, 64, WIDTH), dtype=np.float32) * 2 - 1)}]
