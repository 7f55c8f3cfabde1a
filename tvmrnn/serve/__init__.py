"""`tvmrnn serve`: an inference service for compiled modules over the open inference protocol v2 (KServe/Triton).

| module | job |
|---|---|
| `protocol` | v2 JSON and binary tensor codec, error bodies |
| `signature` | what a model's metadata says about batching, padding and recurrent state |
| `workers` | where batches run: this process, or a worker process (crash-isolated); GPU buffers |
| `batcher` | dynamic batching per model (GPU batches padded to buckets) |
| `sequences` | streaming state of live sequences |
| `core` | one model's inference: checks, streaming state, batching |
| `engine`, `frames` | a model's engine process serving several HTTP workers; tensors as raw-byte frames |
| `cluster` | `--http-workers N`: the supervisor of the HTTP workers and engines |
| `metrics`, `logs` | Prometheus metrics (and Triton's statistics from them), JSON-lines logs |
| `repository` | loading the models named at start |
| `app`, `server` | the ASGI routes; uvicorn in the foreground or a thread |
"""

_EXPORTS = {"create_app": "app", "ServeConfig": "config", "load_models": "repository", "ServerThread": "server",
            "serve_forever": "server"}
__all__ = list(_EXPORTS)


def __getattr__(name):  # lazy, so a model worker (python -m tvmrnn.serve.workers) imports no web stack
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tvmrnn.serve' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
