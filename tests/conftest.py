"""Shared test setup: the tests folder on sys.path (reference, onnx_cases), the `gpu` marker's skip, and progress a
person can follow."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """`pytest -q` still names each test file as it goes, with the share done: a run of minutes shows where it is."""
    if config.option.verbose < 0 and not config.option.collectonly:  # `--collect-only -q` keeps listing bare test ids
        config.option.verbose = 0


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
