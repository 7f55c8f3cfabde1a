"""Where a model's batches run: in a worker process of its own or in this process (`auto`: this process for GPU
modules without index inputs, a worker process for the others).

A compiled module trusts its inputs: an integer input used as an index (a token id beyond the
vocabulary, say) can make it read out of bounds and crash the process. With process isolation that
kills only the model's worker: the runner reports `WorkerCrashed`, starts a fresh worker and the
batcher re-runs the batch's requests one by one, so only the request that crashes it fails.

A runner runs one batch at a time for its model's batcher: in the batcher's executor thread, or on the event loop of
the model's engine process (`engine.py`), which has nothing else to do meanwhile. Tensors travel to and from a worker
process as frames (`frames.py`), never pickled. The worker loads the module with `tvmrnn.runtime.load_module` only,
from a path given at start.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Protocol

import numpy as np

from ..errors import InputError, UnsupportedModelError
from .frames import decode_frame, decode_tensors, encode_frame

_START_TIMEOUT_S = 300.0


class WorkerCrashed(RuntimeError):
    """The worker process died while running a batch (it has been restarted)."""


def settle_heap() -> None:
    """Called by each serving process once it has loaded what it serves: the objects allocated so far (TVM, numpy, and
    torch, which tvm_ffi imports where it is installed: about 250k objects) leave the cyclic collector's sight, so a full
    collection walks only what serving allocated since, instead of pausing the process for tens to hundreds of ms."""
    gc.collect()
    gc.freeze()


class Runner(Protocol):
    metadata: dict

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]: ...

    def close(self) -> None: ...


class InProcessRunner:
    """Runs the module in this process: no IPC, but an input that crashes the compiled code takes the process down.

    On a GPU, batches are assembled in the module's page-locked input buffers, kept per input shape (the batcher pads
    batches to buckets, so shapes repeat); where the module replays a CUDA graph (compiled with bounds), its whole call
    is one graph that reads them there (tvmrnn.graph_replay), else they are copied into device tensors kept per shape;
    the outputs come back the same way. `phases` is the last run's split: copies in, the module to its end, copies out."""

    def __init__(self, path: str, device: str | None = None):
        from ..runtime import load_module

        self._module = load_module(path, device)
        self.metadata = self._module.metadata
        self.restarts = 0
        self.device = self._module.device
        self.on_gpu = not str(self.device).startswith("cpu")
        self.buckets = self.on_gpu
        self.buffer = self._module.host_inputs  # batches assembled straight into the page-locked arrays the copies read
        self.phases: dict[str, float] = {}

    def wait_ready(self) -> None:
        pass

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Inputs already checked per request (Signature.check); the module checks its bounds (max_dims)."""
        result = self._module.run_checked(inputs)
        self.phases = dict(self._module.phases)
        return result

    def close(self) -> None:
        pass


def _worker_main(path: str, device: str | None, conn) -> None:
    """The worker process: load the module, then answer frames of inputs with frames of outputs (or an error message)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server decides when we stop
    try:
        runner = InProcessRunner(path, device)
    except Exception as err:  # noqa: BLE001 - reported to the parent, which refuses to start
        ours = isinstance(err, (InputError, UnsupportedModelError))  # said for people already: no class name
        conn.send(("error", str(err) if ours else f"{type(err).__name__}: {err}"))
        return
    settle_heap()
    conn.send(("ready", runner.metadata))
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):  # the server went away
            return
        if not msg:
            return
        try:
            outs = runner.run(list(decode_tensors(*decode_frame(msg)).values()))
            reply = encode_frame({"status": "ok", "phases": runner.phases}, {str(i): a for i, a in enumerate(outs)})
        except InputError as err:
            reply = encode_frame({"status": "input_error", "message": str(err)})
        except Exception as err:  # noqa: BLE001 - the parent turns it into a 500 for this batch
            reply = encode_frame({"status": "error", "message": f"{type(err).__name__}: {err}"})
        conn.send_bytes(reply)


class ProcessRunner:
    """Runs the module in a worker process (`python -m tvmrnn.serve.workers`, talking over a socket pair);
    restarts it when it dies. A plain subprocess, not multiprocessing: nothing re-imports the caller's script."""

    def __init__(self, path: str, device: str | None = None, name: str = "model", threads: int | None = None):
        self.path, self.device, self.name, self.threads = path, device, name, threads
        self._lock = threading.Lock()
        self.restarts = 0
        self.metadata: dict | None = None
        self.buckets, self.buffer, self.phases = False, None, {}
        self._spawn()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        if self.threads:
            env["TVM_NUM_THREADS"] = str(self.threads)  # TVM's CPU thread pool of this worker
        self._proc = subprocess.Popen([sys.executable, "-m", "tvmrnn.serve.workers", str(theirs.fileno()), self.path, self.device or ""],
                                      pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())

    def wait_ready(self) -> None:
        """Block until the worker has loaded the module; InputError if it could not."""
        if not self._conn.poll(_START_TIMEOUT_S):
            self._kill()
            raise InputError(f"model {self.name!r}: the worker did not load '{self.path}' within {_START_TIMEOUT_S:.0f} s")
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            raise InputError(f"model {self.name!r}: the worker died loading '{self.path}' (exit code {self._wait()})") from None
        if status != "ready":
            self._wait()
            raise InputError(f"model {self.name!r}: {payload}")
        self.metadata = payload
        self.buckets = payload.get("target_kind") == "cuda" and self.device != "cpu"

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            if self._proc.poll() is not None:  # died while idle (killed from outside): not this batch's fault
                self._restart(f"exit code {self._proc.returncode} while idle")
            try:
                self._conn.send_bytes(encode_frame({}, {str(i): a for i, a in enumerate(inputs)}))
                head, data = decode_frame(self._conn.recv_bytes())
            except (EOFError, OSError):
                code = self._wait()
                how = (f"signal {signal.Signals(-code).name}" if code is not None and code < 0 and -code in signal.valid_signals()
                       else f"exit code {code}")
                self._restart(how)
                raise WorkerCrashed(f"model {self.name!r} crashed ({how})") from None
        if head["status"] == "ok":
            self.phases = head["phases"]
            return [a.copy() for a in decode_tensors(head, data).values()]  # writable, as the module's own outputs
        if head["status"] == "input_error":
            raise InputError(head["message"])
        raise RuntimeError(head["message"])

    def _restart(self, how: str) -> None:
        self.restarts += 1
        self._conn.close()
        self._spawn()
        try:
            self.wait_ready()
        except InputError as err:
            raise RuntimeError(f"model {self.name!r} stopped ({how}) and did not restart: {err}") from None

    def _wait(self, timeout_s: float = 5.0) -> int | None:
        try:
            return self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._wait()

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.send_bytes(b"")
            except OSError:
                pass
            self._wait(10)
            self._kill()
            self._conn.close()


ISOLATIONS = ("auto", "process", "thread")


def in_process_by_default(metadata: dict, device: str | None) -> bool:
    """`auto`: a GPU module without index inputs runs in the serving process (a batch is two copies and a graph launch;
    a process hop would be most of it). A module with index inputs (token ids into a table: model.json's index_bounds)
    is the one an input can crash, and a CPU module's thread pool took longer per batch beside the server's event loop
    than in a process of its own (kws_gru, 2 cores), so both get a worker process."""
    on_gpu = metadata.get("target_kind") == "cuda" and device != "cpu"
    return on_gpu and not metadata.get("index_bounds")


def make_runner(path: str, isolation: str, device: str | None, name: str, threads: int | None = None):
    """isolation: process, thread, or auto (in_process_by_default)."""
    if isolation == "auto":
        from ..runtime import metadata_path

        with open(metadata_path(path)) as f:
            isolation = "thread" if in_process_by_default(json.load(f), device) else "process"
    if isolation == "process":
        return ProcessRunner(path, device, name, threads)
    if isolation == "thread":
        return InProcessRunner(path, device)
    raise InputError(f"isolation {isolation!r} is not one of {ISOLATIONS}")


if __name__ == "__main__":  # python -m tvmrnn.serve.workers FD MODULE.so [DEVICE]
    _worker_main(sys.argv[2], sys.argv[3] or None if len(sys.argv) > 3 else None, Connection(int(sys.argv[1])))
