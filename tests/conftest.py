"""Shared test setup: the tests folder on sys.path (reference, onnx_cases) and the `gpu` marker's skip."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _gpu_present() -> bool:
    try:
        import tvm

        return tvm.cuda(0).exist
    except Exception:  # no CUDA driver
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run `pytest -m gpu` on one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
