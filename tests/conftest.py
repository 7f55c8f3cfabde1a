"""Shared test setup: the tests folder on sys.path (reference, onnx_cases), the `gpu` marker's skip, and progress a
person can follow."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """`pytest -q` still shows its progress line with the share done (in one process also each test file's name): a run
    of minutes shows where it is."""
    if config.option.verbose < 0 and not config.option.collectonly:  # `--collect-only -q` keeps listing bare test ids
        config.option.verbose = 0


GPU_WORKERS = 4  # processes sharing one GPU: each holds its own CUDA context and kernel caches


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per physical core this process may use (xdist's own count ignores CPU affinity and
    container limits), at most GPU_WORKERS where the GPU tests run too."""
    import psutil

    usable = len(os.sched_getaffinity(0))
    cores = min(usable, psutil.cpu_count(logical=False) or usable)
    return min(cores, GPU_WORKERS) if _gpu_present() else cores


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
