"""Several HTTP workers in front of one engine process per model (`tvmrnn serve --http-workers N`, N > 1).

One Python process parses a few thousand HTTP requests a second; a GPU runs a batch of 32 utterances in well under a
millisecond. So the HTTP work is spread over N worker processes listening on the port (each on a socket of its own
where the kernel has SO_REUSEPORT, which spreads the connections over them), while each model is batched and run by a
single engine process (`engine.py`), which sees the requests of every worker and so forms full batches. This
supervisor starts the engines, then the workers; restarts either when one dies (an engine's restart fails its in-flight
requests with 503; a model with index inputs runs in a worker process of the engine's own, so a crashing input costs
only that request, as with one HTTP worker); and on SIGTERM/SIGINT stops the workers first (they finish their in-flight
requests) and the engines last.

The processes share their Prometheus metrics through PROMETHEUS_MULTIPROC_DIR (a directory of its own per start).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..errors import InputError
from .engine import config_to_json

log = logging.getLogger("tvmrnn.serve")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Child:
    """One engine (`wait_ready`: it says when it listens) or HTTP worker process, started again when it dies."""

    def __init__(self, what: str, argv: list[str], env: dict, pass_fds=(), wait_ready: bool = False):
        self.what, self.argv, self.env, self.pass_fds, self.wait_ready = what, argv, env, tuple(pass_fds), wait_ready
        self.restarts = 0
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, *self.argv], env=self.env, pass_fds=self.pass_fds, text=True,
                                     stdin=subprocess.PIPE if self.wait_ready else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if self.wait_ready else None)
        if self.wait_ready:
            line = self.proc.stdout.readline()  # an engine prints "ready" once it listens (the module loaded)
            if line.strip() != "ready":
                raise InputError(f"{self.what} did not start (exit code {self.proc.wait()}); see its log above")

    def restart_if_dead(self, metrics_dir: str) -> None:
        if self.proc.poll() is None:
            return
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(self.proc.pid, metrics_dir)
        self.restarts += 1
        log.warning("process restarted", extra={"fields": {"process": self.what, "exit_code": self.proc.returncode,
                                                           "restarts": self.restarts}})
        self.start()

    def stop(self, timeout_s: float) -> None:
        """An engine stops when its stdin closes, an HTTP worker on SIGTERM (finishing its requests in flight)."""
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            else:
                self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve_cluster(paths: list[str], config, sock: socket.socket, log_level: str, echo=print) -> None:
    """Serve `paths` on `sock` with config.http_workers HTTP workers and one engine per model, until SIGTERM/SIGINT."""
    from .repository import check_paths, model_name

    check_paths(paths, config)
    workdir = tempfile.mkdtemp(prefix="tvmrnn-serve-")
    metrics_dir = os.path.join(workdir, "metrics")
    os.makedirs(metrics_dir)
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=metrics_dir,
               PYTHONPATH=os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    engines, workers = [], []
    try:
        models = {}
        for path in paths:
            name, sock_path = model_name(path), os.path.join(workdir, f"{model_name(path)}.sock")
            engines.append(_Child(f"engine of model {name!r}", ["-m", "tvmrnn.serve.engine", sock_path, os.path.abspath(path),
                                                               config_to_json(config), log_level], env, wait_ready=True))
            models[name] = [os.path.abspath(path), sock_path]
        listening = _worker_sockets(sock, config.http_workers)
        workers = [_Child(f"HTTP worker {i}", ["-m", "tvmrnn.serve.cluster", str(s.fileno()), json.dumps(models),
                                               config_to_json(config), log_level], env, pass_fds=[s.fileno()])
                   for i, s in enumerate(listening)]
        echo(f"serving {sorted(models)} on http://{sock.getsockname()[0]}:{sock.getsockname()[1]}/v2 (metrics at /metrics; "
             f"{config.http_workers} HTTP workers, one engine per model)")
        sys.stdout.flush()
        while not stopping:
            time.sleep(0.2)
            for child in engines + workers:
                if not stopping:
                    child.restart_if_dead(metrics_dir)
    finally:
        for child in workers:
            child.stop(config.graceful_timeout_s + 5)
        for child in engines:
            child.stop(config.graceful_timeout_s + 5)
        shutil.rmtree(workdir, ignore_errors=True)


def _worker_sockets(sock: socket.socket, n: int) -> list[socket.socket]:
    """A listening socket per HTTP worker. Where `sock` has SO_REUSEPORT, n - 1 more on its port, so the kernel spreads
    the connections evenly (a shared socket goes to whichever worker wakes first: 4 workers took 65%, 23%, 15% and 0%
    of 32 connections); each restart of a worker gets its socket again. Else every worker listens on `sock`."""
    if not hasattr(socket, "SO_REUSEPORT") or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
        return [sock] * n
    from .server import bind

    host, port = sock.getsockname()[:2]
    return [sock] + [bind(host, port, reuse_port=True) for _ in range(n - 1)]


def _http_worker(fd: int, models_json: str, config_json: str, log_level: str) -> None:
    """An HTTP worker: the v2 routes on the inherited socket, each model's requests sent to its engine."""
    import logging.config

    from .app import create_app
    from .engine import RemoteCore, config_from_json
    from .logs import logging_config
    from .repository import ServedModel, read_metadata
    from .server import serve_forever
    from .signature import build_signature

    logging.config.dictConfig(logging_config(log_level))
    config = config_from_json(config_json)
    models, sockets = {}, {}
    for name, (path, sock_path) in json.loads(models_json).items():
        sig = build_signature(name, read_metadata(path), config.state.get(name))
        models[name], sockets[name] = ServedModel(name, path, sig, None), sock_path

    async def connect():
        cores = {name: RemoteCore(name, m.signature, sockets[name]) for name, m in models.items()}
        await asyncio.gather(*(c.connect() for c in cores.values()))

        async def disconnect():
            for c in cores.values():
                await c.close()

        return cores, disconnect

    sock = socket.socket(fileno=fd)
    serve_forever(create_app(models, config, connect=connect), sock, config.graceful_timeout_s, log_level)


if __name__ == "__main__":  # python -m tvmrnn.serve.cluster FD MODELS_JSON CONFIG_JSON LOG_LEVEL
    _http_worker(int(sys.argv[1]), *sys.argv[2:5])
