"""The served models: loaded once at start from the paths given on the command line, never from a request.

A model's name is its .so file's stem. Each gets a runner (a worker process, or this process) that loads
it with `tvmrnn.runtime.load_module`, and a `Signature` from its metadata (batching, padding, state).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ..errors import InputError
from ..runtime import metadata_path
from .config import ServeConfig
from .signature import Signature, build_signature, padding_is_exact
from .workers import make_runner

log = logging.getLogger("tvmrnn.serve")


@dataclass
class ServedModel:
    name: str
    path: str
    signature: Signature
    runner: object  # None in an HTTP worker whose models run in engine processes


def model_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def read_metadata(path: str) -> dict:
    import json

    with open(metadata_path(path)) as f:
        return json.load(f)


def check_paths(paths, config: ServeConfig) -> list[str]:
    """The models' names; InputError for no model, two of one name, a --state for none of them, or a missing file."""
    if not paths:
        raise InputError("no model given; pass one or more compiled modules (.so)")
    names = [model_name(p) for p in paths]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"two modules are both named {dup[0]!r} (a model's name is its file's stem); rename one")
    unknown = sorted(set(config.state) - set(names))
    if unknown:
        raise InputError(f"--state names model {unknown[0]!r}, which is not served; models are {names}")
    for p in paths:
        for f in (p, metadata_path(p)):
            if not os.path.exists(f):
                raise InputError(f"'{f}' does not exist (a compiled module is a .so with its .json beside it)")
    return names


def load_models(paths, config: ServeConfig) -> dict[str, "ServedModel"]:
    """Start a runner per module (in parallel), read their signatures, check padding; InputError if any fails."""
    names = check_paths(paths, config)
    runners = {}
    try:
        for name, path in zip(names, paths):
            runners[name] = make_runner(os.path.abspath(path), config.isolation, config.device, name, config.threads)
        models = {}
        for name, path in zip(names, paths):
            runner = runners[name]
            runner.wait_ready()
            sig = build_signature(name, runner.metadata, config.state.get(name))
            if sig.pad_dim is not None and not _padding_ok(sig, runner):
                sig.pad_dim = None
            models[name] = ServedModel(name, os.path.abspath(path), sig, runner)
            log.info("model loaded", extra={"fields": {
                "model": name, "path": os.path.abspath(path), "target": runner.metadata.get("target_kind"),
                "batch_dim": sig.batch_dim if sig.batchable else None, "not_batchable": sig.why_not_batchable or None,
                "pad_dim": sig.pad_dim, "state": sig.state_pairs or None}})
        return models
    except BaseException:
        for r in runners.values():
            r.close()
        raise


def _padding_ok(sig: Signature, runner) -> bool:
    try:
        ok = padding_is_exact(sig, runner.run)
    except Exception as err:  # noqa: BLE001 - then we do not pad
        log.warning("padding check failed", extra={"fields": {"model": sig.name, "error": str(err)}})
        return False
    if not ok:
        log.warning("padding changes this model's outputs: requests of different lengths run separately",
                    extra={"fields": {"model": sig.name, "dim": sig.pad_dim}})
    return ok
