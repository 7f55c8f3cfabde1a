"""`tvmrnn serve` on the GPU: kws_gru and streaming_lstm compiled for CUDA with bounds (so they replay CUDA graphs), served
in one process and with HTTP workers; every answer equals the module's own direct call, one request at a time."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import numpy as np
import pytest

import tvmrnn
from test_serve import REPO, _start_cli_server, as_arrays, assert_close, infer, kws_input, metric, tensor

pytestmark = pytest.mark.gpu
BOUNDS = {"batch": 32, "time": 64}


@pytest.fixture(scope="module")
def cuda_modules(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve_cuda")
    return {name: str(tvmrnn.compile(os.path.join(REPO, "models", f"{name}.onnx"), target="cuda", max_dims=BOUNDS)
                      .export(out / f"{name}.so")) for name in ("kws_gru", "streaming_lstm")}


def _post_all(url, model, bodies):
    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=64)) as c:
            return await asyncio.gather(*(c.post(f"/v2/models/{model}/infer", json=b) for b in bodies))

    return asyncio.run(main())


def _check_kws(url, direct, n=48):
    feeds_list = [kws_input(500 + i, batch=1 + i % 3, time_=50) for i in range(n)]
    responses = _post_all(url, "kws_gru", [{"inputs": [tensor("mfcc", f["mfcc"])]} for f in feeds_list])
    for feeds, r in zip(feeds_list, responses):
        assert r.status_code == 200, r.text
        assert_close(as_arrays(r), direct.run(feeds))


def _check_streams(url, direct, n_seq=6, chunks=5):
    rng = np.random.default_rng(16)
    audios = [rng.standard_normal((chunks * 4, 1, 40)).astype("float32") for _ in range(n_seq)]

    async def one(c, k):
        outs = []
        for i, chunk in enumerate(np.split(audios[k], chunks)):
            params = {"sequence_id": 700 + k, "sequence_start": i == 0, "sequence_end": i == chunks - 1}
            r = await c.post("/v2/models/streaming_lstm/infer", json={"parameters": params, "inputs": [tensor("chunk", chunk)]})
            assert r.status_code == 200, r.text
            outs.append(as_arrays(r)["out"])
        return np.concatenate(outs)

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            return await asyncio.gather(*(one(c, k) for k in range(n_seq)))

    zeros = np.zeros((1, 1, 96), "float32")
    for audio, out in zip(audios, asyncio.run(main())):
        np.testing.assert_allclose(out, direct.run({"chunk": audio, "h_in": zeros, "c_in": zeros})["out"], rtol=1e-4, atol=1e-5)


def test_gpu_batches_in_buckets_equal_direct_calls(cuda_modules):
    from tvmrnn.serve import ServeConfig, ServerThread, create_app, load_models

    direct = {n: tvmrnn.load(p) for n, p in cuda_modules.items()}
    config = ServeConfig(max_batch_size=32, max_delay_ms=20)
    models = load_models(list(cuda_modules.values()), config)
    runner = models["kws_gru"].runner
    assert runner.on_gpu and runner.buckets
    with ServerThread(create_app(models, config)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        _check_kws(srv.url, direct["kws_gru"])
        _check_streams(srv.url, direct["streaming_lstm"])
        assert runner.buffer._pinned, "batches are assembled in page-locked buffers"
        first = runner._module.input_names[0]  # page-locked inputs kept per bucket (the kernels read them): powers of two rows
        shapes = {shape for name, shape, _ in runner.buffer._entries if name == first}
        assert shapes and all(s[0] in (1, 2, 4, 8, 16, 32) for s in shapes), shapes
        rows, batches = metric(c, "tvmrnn_batch_size_sum", "kws_gru"), metric(c, "tvmrnn_batch_size_count", "kws_gru")
        assert rows / batches > 1.5
        stats = c.get("/v2/models/kws_gru/stats").json()["model_stats"][0]["inference_stats"]
        assert stats["compute_infer"]["ns"] > 0 and stats["compute_input"]["ns"] > 0


def test_gpu_http_workers_equal_direct_calls(cuda_modules):
    direct = {n: tvmrnn.load(p) for n, p in cuda_modules.items()}
    proc, url = _start_cli_server(list(cuda_modules.values()), "--http-workers", "3", "--max-delay-ms", "5")
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            _check_kws(url, direct["kws_gru"], n=96)
            _check_streams(url, direct["streaming_lstm"])
            r = infer(c, "kws_gru", kws_input(0, 1, 65), check=False)  # past the module's time bound: 400 naming it
            assert r.status_code == 400 and "time <= 64" in r.text, r.text
            assert c.get("/v2/models/kws_gru/config").json()["instance_group"][0]["kind"] == "KIND_GPU"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
