"""`tvmrnn serve`: serve compiled modules over HTTP (open inference protocol v2) with dynamic batching and streaming state."""

from __future__ import annotations

import logging.config
import socket
import sys
from dataclasses import dataclass, field

from ..errors import InputError
from . import show_args


@dataclass
class ServeArgs:
    modules: tuple
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_size: int = 32
    max_delay_ms: float = 5.0
    max_request_bytes: int = 64 * 2**20
    sequence_idle_s: float = 60.0
    max_sequences: int = 1024
    state: tuple = ()  # "MODEL:INPUT=OUTPUT" pairs replacing the NAME_in/NAME_out rule for MODEL
    isolation: str = "auto"
    device: str | None = None
    log_level: str = "info"
    graceful_timeout_s: float = 30.0
    threads: int | None = None  # TVM CPU threads per model worker
    http_workers: int = 1  # HTTP worker processes; more than 1: one engine process per model batches for all of them
    state_pairs: dict = field(default_factory=dict)  # resolved from `state`

    def show(self) -> str:
        return show_args(self, {"device": "the module's target", "threads": "TVM's default"}, skip=("state",))


def resolve(args: ServeArgs) -> ServeArgs:
    """Check the numbers and parse --state; InputError naming the bad option."""
    from ..serve.signature import parse_state_option

    for opt, value, low in (("--port", args.port, 0), ("--max-batch-size", args.max_batch_size, 1),
                            ("--max-delay-ms", args.max_delay_ms, 0), ("--max-request-bytes", args.max_request_bytes, 1),
                            ("--sequence-idle-s", args.sequence_idle_s, 0.001), ("--max-sequences", args.max_sequences, 1)):
        if value < low:
            raise InputError(f"{opt} is {value}; it must be at least {low}")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads is {args.threads}; it must be at least 1")
    if args.isolation not in ("auto", "process", "thread"):
        raise InputError(f"--isolation is {args.isolation!r}; one of ('auto', 'process', 'thread')")
    if args.http_workers < 1:
        raise InputError(f"--http-workers is {args.http_workers}; it must be at least 1")
    if args.port > 65535:
        raise InputError(f"--port is {args.port}; it must be at most 65535")
    from ..runtime import check_cuda_here, read_metadata

    for path in args.modules:  # an ONNX file, a missing .json, a foreign one or a GPU-less host: said before anything starts
        check_cuda_here(read_metadata(path))
    args.state_pairs = parse_state_option(args.state)
    return args


def serve_command(args: ServeArgs, echo=print) -> None:
    from ..serve import ServeConfig, create_app, load_models, serve_forever
    from ..serve.logs import logging_config
    from ..serve.server import bind

    args = resolve(args)
    echo(f"tvmrnn serve\n{args.show()}")
    logging.config.dictConfig(logging_config(args.log_level))
    config = ServeConfig(max_batch_size=args.max_batch_size, max_delay_ms=args.max_delay_ms, max_request_bytes=args.max_request_bytes,
                         sequence_idle_s=args.sequence_idle_s, max_sequences=args.max_sequences, isolation=args.isolation,
                         device=args.device, state=args.state_pairs, threads=args.threads, graceful_timeout_s=args.graceful_timeout_s,
                         http_workers=args.http_workers)
    try:
        sock = bind(args.host, args.port, reuse_port=config.http_workers > 1 and hasattr(socket, "SO_REUSEPORT"))
    except OSError as err:
        raise InputError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None
    port = sock.getsockname()[1]
    if config.http_workers > 1:
        from ..serve.cluster import serve_cluster

        return serve_cluster(list(args.modules), config, sock, args.log_level, echo)
    models = load_models(list(args.modules), config)
    echo(f"serving {sorted(models)} on http://{args.host}:{port}/v2 (metrics at /metrics)")
    sys.stdout.flush()
    serve_forever(create_app(models, config), sock, args.graceful_timeout_s, args.log_level)
