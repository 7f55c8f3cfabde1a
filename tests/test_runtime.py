"""The runtime's process setup: TVM's CPU thread pool gets one thread per usable physical core unless the user says."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

PROBE = "import os, tvmrnn.runtime; print(os.environ.get('TVM_NUM_THREADS'))"


def _threads_after_import(**env_extra) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_thread_pool_uses_every_physical_core():
    usable = len(os.sched_getaffinity(0))
    assert _threads_after_import() == str(min(usable, psutil.cpu_count(logical=False) or usable))


def test_user_thread_settings_win():
    assert _threads_after_import(OMP_NUM_THREADS="1") == "None"
    assert _threads_after_import(TVM_NUM_THREADS="3") == "3"
