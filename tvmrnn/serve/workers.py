"""Where a model's batches run: in a worker process of its own (default) or in this process.

A compiled module trusts its inputs: an integer input used as an index (a token id beyond the
vocabulary, say) can make it read out of bounds and crash the process. With process isolation that
kills only the model's worker: the runner reports `WorkerCrashed`, starts a fresh worker and the
batcher re-runs the batch's requests one by one, so only the request that crashes it fails.

Both runners are called from one thread per model (the batcher's executor), never from the event loop.
The worker loads the module with `tvmrnn.runtime.load_module` only, from a path given at start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Protocol

import numpy as np

from ..errors import InputError

_START_TIMEOUT_S = 300.0


class WorkerCrashed(RuntimeError):
    """The worker process died while running a batch (it has been restarted)."""


class Runner(Protocol):
    metadata: dict

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]: ...

    def close(self) -> None: ...


class InProcessRunner:
    """Runs the module in this process (`--isolation thread`): no IPC, but a crashing input takes the server down."""

    def __init__(self, path: str, device: str | None = None):
        from ..runtime import load_module

        self._module = load_module(path, device)
        self.metadata = self._module.metadata
        self.restarts = 0

    def wait_ready(self) -> None:
        pass

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        outs = self._module.run(dict(zip(self._module.input_names, inputs)))
        return [outs[n] for n in self._module.output_names]

    def close(self) -> None:
        pass


def _worker_main(path: str, device: str | None, conn) -> None:
    """The worker process: load the module, then answer [arrays] -> ("ok", [arrays]) | ("input_error"|"error", message)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server decides when we stop
    try:
        from ..runtime import load_module

        module = load_module(path, device)
    except Exception as err:  # noqa: BLE001 - reported to the parent, which refuses to start
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", module.metadata))
    names, out_names = module.input_names, module.output_names
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the server went away
            return
        if msg is None:
            return
        try:
            outs = module.run(dict(zip(names, msg)))
            conn.send(("ok", [outs[n] for n in out_names]))
        except InputError as err:
            conn.send(("input_error", str(err)))
        except Exception as err:  # noqa: BLE001 - the parent turns it into a 500 for this batch
            conn.send(("error", f"{type(err).__name__}: {err}"))


class ProcessRunner:
    """Runs the module in a worker process (`python -m tvmrnn.serve.workers`, talking over a socket pair);
    restarts it when it dies. A plain subprocess, not multiprocessing: nothing re-imports the caller's script."""

    def __init__(self, path: str, device: str | None = None, name: str = "model", threads: int | None = None):
        self.path, self.device, self.name, self.threads = path, device, name, threads
        self._lock = threading.Lock()
        self.restarts = 0
        self.metadata: dict | None = None
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

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            if self._proc.poll() is not None:  # died while idle (killed from outside): not this batch's fault
                self._restart(f"exit code {self._proc.returncode} while idle")
            try:
                self._conn.send(inputs)
                status, payload = self._conn.recv()
            except (EOFError, OSError):
                code = self._wait()
                how = (f"signal {signal.Signals(-code).name}" if code is not None and code < 0 and -code in signal.valid_signals()
                       else f"exit code {code}")
                self._restart(how)
                raise WorkerCrashed(f"model {self.name!r} crashed ({how})") from None
        if status == "ok":
            return payload
        if status == "input_error":
            raise InputError(payload)
        raise RuntimeError(payload)

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
                self._conn.send(None)
            except OSError:
                pass
            self._wait(10)
            self._kill()
            self._conn.close()


def make_runner(path: str, isolation: str, device: str | None, name: str, threads: int | None = None):
    if isolation == "process":
        return ProcessRunner(path, device, name, threads)
    if isolation == "thread":
        return InProcessRunner(path, device)
    raise InputError(f"isolation {isolation!r} is not one of ('process', 'thread')")


if __name__ == "__main__":  # python -m tvmrnn.serve.workers FD MODULE.so [DEVICE]
    _worker_main(sys.argv[2], sys.argv[3] or None if len(sys.argv) > 3 else None, Connection(int(sys.argv[1])))
