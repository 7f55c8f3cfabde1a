"""`tvmrnn serve`: the real server on a loopback port, spoken to over HTTP.

Models compile once per pytest session; one server (process-isolated workers, as deployed) serves them to
most tests. Covered: v2 metadata, JSON and binary infer, streaming state over 20 chunks against one
whole-sequence run, dynamic batching (seen in /metrics), padding of different lengths, every kind of
bad input answered with a 4xx v2 error and followed by a good request, a crashing input, sequence
limits and expiry, graceful shutdown of `tvmrnn serve` in a subprocess, and Triton's own client (tritonclient).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

import tvmrnn
from tvmrnn.errors import InputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("streaming_lstm", "kws_gru", "rnn_forecast", "lstm_lm")
MAX_SEQUENCES = 4
IDLE_S = 1.5
MAX_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve_modules")
    paths = {}
    for name in MODELS:
        paths[name] = str(tvmrnn.compile(os.path.join(REPO, "models", f"{name}.onnx"), target="llvm").export(out / f"{name}.so"))
    return paths


@pytest.fixture(scope="module")
def reference(modules):
    """The same modules run in this process, one request at a time: what the server must answer."""
    return {name: tvmrnn.load(path) for name, path in modules.items()}


@pytest.fixture(scope="module")
def server(modules):
    from tvmrnn.serve import ServeConfig, ServerThread, create_app, load_models

    config = ServeConfig(max_batch_size=16, max_delay_ms=20, max_request_bytes=MAX_BYTES, sequence_idle_s=IDLE_S,
                         max_sequences=MAX_SEQUENCES)
    models = load_models([modules[n] for n in MODELS], config)
    with ServerThread(create_app(models, config)) as srv:
        yield srv


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def tensor(name, arr, binary=False):
    from tvmrnn.serve.protocol import v2_datatype

    t = {"name": name, "shape": list(arr.shape), "datatype": v2_datatype(arr.dtype)}
    if binary:
        t["parameters"] = {"binary_data_size": arr.nbytes}
    else:
        t["data"] = arr.tolist()  # nested lists: the server takes flat or nested
    return t


def infer(client, model, feeds, parameters=None, outputs=None, check=True):
    body = {"inputs": [tensor(n, a) for n, a in feeds.items()]}
    if parameters:
        body["parameters"] = parameters
    if outputs:
        body["outputs"] = [{"name": o} for o in outputs]
    r = client.post(f"/v2/models/{model}/infer", json=body)
    if check:
        assert r.status_code == 200, r.text
    return r


def as_arrays(response) -> dict[str, np.ndarray]:
    from tvmrnn.serve.protocol import V2_TO_NUMPY

    return {o["name"]: np.asarray(o["data"], V2_TO_NUMPY[o["datatype"]]).reshape(o["shape"]) for o in response.json()["outputs"]}


def kws_input(seed=0, batch=1, time_=30):
    return {"mfcc": np.random.default_rng(seed).standard_normal((batch, time_, 40)).astype("float32")}


def forecast_input(seed, seq, batch=1):
    rng = np.random.default_rng(seed)
    return {"series": rng.standard_normal((seq, batch, 8)).astype("float32"),
            "lengths": rng.integers(1, seq + 1, batch).astype("int32")}


def metric(client, name, model) -> float:
    m = re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', client.get("/metrics").text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def assert_close(got, want):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


# -- health and metadata ---------------------------------------------------------------------------
def test_health_and_server_metadata(client):
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    meta = client.get("/v2").json()
    assert meta["name"] == "tvmrnn" and "binary_tensor_data" in meta["extensions"]
    for name in MODELS:
        assert client.get(f"/v2/models/{name}/ready").status_code == 200
        assert client.get(f"/v2/models/{name}/versions/1/ready").status_code == 200


def test_model_metadata(client):
    kws = client.get("/v2/models/kws_gru").json()
    assert kws["name"] == "kws_gru" and kws["versions"] == ["1"]
    assert kws["inputs"] == [{"name": "mfcc", "datatype": "FP32", "shape": [-1, -1, 40]}]
    assert kws["outputs"] == [{"name": "keyword_logits", "datatype": "FP32", "shape": [-1, 12]}]
    stream = client.get("/v2/models/streaming_lstm/versions/1").json()
    assert [i["name"] for i in stream["inputs"]] == ["chunk", "h_in", "c_in"]
    assert stream["inputs"][1]["shape"] == [1, -1, 96]
    forecast = client.get("/v2/models/rnn_forecast").json()
    assert forecast["inputs"][1] == {"name": "lengths", "datatype": "INT32", "shape": [-1]}
    assert client.get("/v2/models/lstm_lm").json()["inputs"][0]["datatype"] == "INT64"


# -- infer -----------------------------------------------------------------------------------------
def test_infer_json_matches_the_runtime(client, reference):
    feeds = kws_input(1, batch=2)
    r = infer(client, "kws_gru", feeds)
    body = r.json()
    assert body["model_name"] == "kws_gru" and r.headers["content-type"] == "application/json"
    assert_close(as_arrays(r), reference["kws_gru"].run(feeds))
    flat = {"inputs": [{"name": "mfcc", "shape": [2, 30, 40], "datatype": "FP32", "data": feeds["mfcc"].ravel().tolist()}], "id": "r-7"}
    r = client.post("/v2/models/kws_gru/infer", json=flat)
    assert r.status_code == 200 and r.json()["id"] == "r-7"
    assert_close(as_arrays(r), reference["kws_gru"].run(feeds))


def _binary_request(feeds, outputs=None, binary_output=True):
    head = {"inputs": [tensor(n, a, binary=True) for n, a in feeds.items()]}
    if outputs is not None:
        head["outputs"] = [{"name": o, "parameters": {"binary_data": binary_output}} for o in outputs]
    else:
        head["parameters"] = {"binary_data_output": binary_output}
    head_bytes = json.dumps(head).encode()
    body = head_bytes + b"".join(np.ascontiguousarray(a).tobytes() for a in feeds.values())
    return body, {"Inference-Header-Content-Length": str(len(head_bytes)), "Content-Type": "application/octet-stream"}


def _binary_response(r) -> dict[str, np.ndarray]:
    from tvmrnn.serve.protocol import V2_TO_NUMPY

    n = int(r.headers["Inference-Header-Content-Length"])
    head, offset, out = json.loads(r.content[:n]), n, {}
    for o in head["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(r.content[offset:offset + size], V2_TO_NUMPY[o["datatype"]]).reshape(o["shape"])
        offset += size
    assert offset == len(r.content)
    return out


def test_infer_binary_in_and_out(client, reference):
    feeds = forecast_input(3, seq=7, batch=3)
    want = reference["rnn_forecast"].run(feeds)
    body, headers = _binary_request(feeds)
    r = client.post("/v2/models/rnn_forecast/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    assert_close(_binary_response(r), want)
    # binary in, JSON out; and one output of several chosen by name
    stream = {"chunk": np.ones((4, 1, 40), "float32"), "h_in": np.zeros((1, 1, 96), "float32"), "c_in": np.zeros((1, 1, 96), "float32")}
    body, headers = _binary_request(stream, outputs=["h_out"], binary_output=False)
    r = client.post("/v2/models/streaming_lstm/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    got = as_arrays(r)
    assert list(got) == ["h_out"]
    assert_close(got, {"h_out": reference["streaming_lstm"].run(stream)["h_out"]})


def test_gzip_request(client, reference):
    feeds = kws_input(4)
    body = gzip.compress(json.dumps({"inputs": [tensor("mfcc", feeds["mfcc"])]}).encode())
    r = client.post("/v2/models/kws_gru/infer", content=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert_close(as_arrays(r), reference["kws_gru"].run(feeds))


# -- streaming -------------------------------------------------------------------------------------
def _stream(client, sid, chunks, end=True):
    outs, last = [], None
    for i, chunk in enumerate(chunks):
        params = {"sequence_id": sid, "sequence_start": i == 0, "sequence_end": end and i == len(chunks) - 1}
        last = as_arrays(infer(client, "streaming_lstm", {"chunk": chunk}, params))
        outs.append(last["out"])
    return np.concatenate(outs), last


def test_streaming_sequence_equals_one_whole_run(client, reference):
    rng = np.random.default_rng(5)
    audio = rng.standard_normal((20 * 6, 1, 40)).astype("float32")
    zeros = np.zeros((1, 1, 96), "float32")
    whole = reference["streaming_lstm"].run({"chunk": audio, "h_in": zeros, "c_in": zeros})
    out, last = _stream(client, 4242, np.split(audio, 20))
    np.testing.assert_allclose(out, whole["out"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(last["h_out"], whole["h_out"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(last["c_out"], whole["c_out"], rtol=1e-4, atol=1e-5)
    # sequence_end dropped the state: going on without sequence_start is refused
    r = infer(client, "streaming_lstm", {"chunk": audio[:6]}, {"sequence_id": 4242}, check=False)
    assert r.status_code == 400 and "not live" in r.json()["error"]


def test_concurrent_sequences_keep_their_own_state(server, reference):
    """Eight sequences (string ids, chunks of unequal length) streamed at once; each equals its own whole run."""
    rng = np.random.default_rng(6)
    audios = [rng.standard_normal((24, 1, 40)).astype("float32") for _ in range(MAX_SEQUENCES)]
    cuts = [[0, 5, 11, 17, 24], [0, 6, 12, 18, 24], [0, 3, 13, 20, 24], [0, 8, 16, 20, 24]]

    async def one(c, k):
        outs = []
        for i in range(4):
            params = {"sequence_id": f"user-{k}", "sequence_start": i == 0, "sequence_end": i == 3}
            r = await c.post("/v2/models/streaming_lstm/infer", json={"parameters": params, "inputs": [
                tensor("chunk", audios[k][cuts[k][i]:cuts[k][i + 1]])]})
            assert r.status_code == 200, r.text
            outs.append(as_arrays(r)["out"])
        return np.concatenate(outs)

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            return await asyncio.gather(*(one(c, k) for k in range(MAX_SEQUENCES)))

    zeros = np.zeros((1, 1, 96), "float32")
    for audio, out in zip(audios, asyncio.run(main())):
        want = reference["streaming_lstm"].run({"chunk": audio, "h_in": zeros, "c_in": zeros})["out"]
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_sequence_limit_gives_429_and_idle_sequences_expire(client):
    chunk = {"chunk": np.ones((2, 1, 40), "float32")}
    for k in range(MAX_SEQUENCES):
        infer(client, "streaming_lstm", chunk, {"sequence_id": 9000 + k, "sequence_start": True})
    r = infer(client, "streaming_lstm", chunk, {"sequence_id": 9999, "sequence_start": True}, check=False)
    assert r.status_code == 429, r.text
    assert "too many live sequences" in r.json()["error"] and "--max-sequences" in r.json()["error"]
    infer(client, "streaming_lstm", chunk, {"sequence_id": 9000, "sequence_end": True})  # frees a slot
    infer(client, "streaming_lstm", chunk, {"sequence_id": 9999, "sequence_start": True, "sequence_end": True})
    expired = metric(client, "tvmrnn_sequences_expired_total", "streaming_lstm")
    time.sleep(IDLE_S + 0.6)
    r = infer(client, "streaming_lstm", chunk, {"sequence_id": 9001}, check=False)
    assert r.status_code == 400 and f"idle for more than {IDLE_S:g} s" in r.json()["error"]
    assert metric(client, "tvmrnn_sequences_expired_total", "streaming_lstm") >= expired + MAX_SEQUENCES - 1
    assert metric(client, "tvmrnn_active_sequences", "streaming_lstm") == 0


# -- batching --------------------------------------------------------------------------------------
def _concurrently(server, model, feeds_list):
    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=64)) as c:
            return await asyncio.gather(*(c.post(f"/v2/models/{model}/infer", json={"inputs": [tensor(n, a) for n, a in f.items()]})
                                          for f in feeds_list))

    return asyncio.run(main())


def test_concurrent_requests_are_batched(server, client, reference):
    rows, batches = (metric(client, f"tvmrnn_batch_size_{s}", "kws_gru") for s in ("sum", "count"))
    feeds_list = [kws_input(100 + i, batch=1 + i % 2) for i in range(32)]
    responses = _concurrently(server, "kws_gru", feeds_list)
    for feeds, r in zip(feeds_list, responses):
        assert r.status_code == 200, r.text
        assert_close(as_arrays(r), reference["kws_gru"].run(feeds))
    rows = metric(client, "tvmrnn_batch_size_sum", "kws_gru") - rows
    batches = metric(client, "tvmrnn_batch_size_count", "kws_gru") - batches
    assert rows == sum(f["mfcc"].shape[0] for f in feeds_list)
    assert rows / batches > 1.5, f"mean batch size {rows / batches:.2f} over {batches:.0f} batches"
    assert metric(client, "tvmrnn_queue_seconds_count", "kws_gru") >= 32
    assert metric(client, "tvmrnn_compute_seconds_count", "kws_gru") == metric(client, "tvmrnn_batch_size_count", "kws_gru")


def test_different_lengths_are_padded_into_one_batch(server, client, reference):
    """rnn_forecast has sequence_lens as a graph input: requests of lengths 3..10 share batches, each answer exact."""
    before = metric(client, "tvmrnn_batch_requests_count", "rnn_forecast")
    feeds_list = [forecast_input(200 + i, seq=3 + i % 8) for i in range(24)]
    responses = _concurrently(server, "rnn_forecast", feeds_list)
    for feeds, r in zip(feeds_list, responses):
        assert r.status_code == 200, r.text
        assert_close(as_arrays(r), reference["rnn_forecast"].run(feeds))
    assert metric(client, "tvmrnn_batch_requests_count", "rnn_forecast") - before < 24


# -- bad input -------------------------------------------------------------------------------------
GOOD = {"inputs": [{"name": "mfcc", "shape": [1, 2, 40], "datatype": "FP32", "data": [0.5] * 80}]}


def _with(**change):
    body = json.loads(json.dumps(GOOD))
    body["inputs"][0].update(change)
    return body


def _without(key):
    body = json.loads(json.dumps(GOOD))
    del body["inputs"][0][key]
    return body


def _binary_body(declared: int, sent: int) -> bytes:
    head = _without("data")
    head["inputs"][0]["parameters"] = {"binary_data_size": declared}
    return json.dumps(head).encode() + b"\0" * sent


BAD = [  # (id, method, path, body (dict: JSON; bytes: raw), headers, status, words in the error)
    ("unknown model", "POST", "/v2/models/nope/infer", GOOD, {}, 404, ["nope", "kws_gru"]),
    ("unknown model metadata", "GET", "/v2/models/nope", None, {}, 404, ["nope"]),
    ("unknown version", "POST", "/v2/models/kws_gru/versions/7/infer", GOOD, {}, 404, ["version", "7"]),
    ("unknown route", "GET", "/v2/nothing/here", None, {}, 404, ["Not Found"]),
    ("wrong method", "GET", "/v2/models/kws_gru/infer", None, {}, 405, ["Method Not Allowed"]),
    ("malformed JSON", "POST", "/v2/models/kws_gru/infer", b'{"inputs": [', {}, 400, ["not valid JSON"]),
    ("empty body", "POST", "/v2/models/kws_gru/infer", b"", {}, 400, ["empty"]),
    ("not an object", "POST", "/v2/models/kws_gru/infer", b"[1, 2]", {}, 400, ["JSON object"]),
    ("no inputs", "POST", "/v2/models/kws_gru/infer", {"outputs": []}, {}, 400, ["'inputs'"]),
    ("no shape", "POST", "/v2/models/kws_gru/infer", _without("shape"), {}, 400, ["'mfcc'", "'shape'"]),
    ("no datatype", "POST", "/v2/models/kws_gru/infer", _without("datatype"), {}, 400, ["'datatype'"]),
    ("no data", "POST", "/v2/models/kws_gru/infer", _without("data"), {}, 400, ["no 'data'"]),
    ("no name", "POST", "/v2/models/kws_gru/infer", _without("name"), {}, 400, ["'name'"]),
    ("wrong input name", "POST", "/v2/models/kws_gru/infer", _with(name="features"), {}, 400, ["'features'", "mfcc"]),
    ("wrong input name and count", "POST", "/v2/models/kws_gru/infer", _with(name="features", data=[0.5] * 3), {}, 400,
     ["unknown input 'features'", "mfcc"]),
    ("wrong datatype", "POST", "/v2/models/kws_gru/infer", _with(datatype="FP64"), {}, 400, ["FP64", "FP32", "'mfcc'"]),
    ("unknown datatype", "POST", "/v2/models/kws_gru/infer", _with(datatype="FLOAT"), {}, 400, ["FLOAT", "not supported"]),
    ("wrong rank", "POST", "/v2/models/kws_gru/infer", _with(shape=[2, 40], data=[0.5] * 80), {}, 400, ["'mfcc'", "rank 3"]),
    ("wrong static dim", "POST", "/v2/models/kws_gru/infer", _with(shape=[1, 2, 41], data=[0.5] * 82), {}, 400, ["'mfcc'", "axis 2 must be 40"]),
    ("empty dim", "POST", "/v2/models/kws_gru/infer", _with(shape=[0, 2, 40], data=[]), {}, 400, ["empty dimension"]),
    ("negative dim", "POST", "/v2/models/kws_gru/infer", _with(shape=[-1, 2, 40]), {}, 400, ["negative"]),
    ("data count", "POST", "/v2/models/kws_gru/infer", _with(data=[0.5] * 79), {}, 400, ["79", "80"]),
    ("strings in data", "POST", "/v2/models/kws_gru/infer", _with(data=["a"] * 80), {}, 400, ["strings"]),
    ("ragged data", "POST", "/v2/models/kws_gru/infer", _with(data=[[0.5] * 40, [0.5] * 39]), {}, 400, ["regular"]),
    ("unknown output", "POST", "/v2/models/kws_gru/infer", {**GOOD, "outputs": [{"name": "logits"}]}, {}, 400, ["'logits'", "keyword_logits"]),
    ("data and binary", "POST", "/v2/models/kws_gru/infer", _with(parameters={"binary_data_size": 320}), {}, 400, ["both"]),
    ("binary size", "POST", "/v2/models/kws_gru/infer", _binary_body(10, 10), {"Inference-Header-Content-Length": "HEAD"}, 400,
     ["binary_data_size", "320"]),
    ("binary missing", "POST", "/v2/models/kws_gru/infer", _binary_body(320, 100), {"Inference-Header-Content-Length": "HEAD"}, 400,
     ["100 byte(s) of binary data left"]),
    ("binary left over", "POST", "/v2/models/kws_gru/infer", _binary_body(320, 330), {"Inference-Header-Content-Length": "HEAD"}, 400,
     ["10 byte(s) of binary data after"]),
    ("header length", "POST", "/v2/models/kws_gru/infer", json.dumps(_without("data") | {"parameters": {}}).encode(),
     {"Inference-Header-Content-Length": "100000"}, 400, ["Inference-Header-Content-Length", "100000"]),
    ("oversized", "POST", "/v2/models/kws_gru/infer", b"{" + b" " * (MAX_BYTES + 10) + b"}", {}, 413, ["--max-request-bytes"]),
    ("gzip bomb", "POST", "/v2/models/kws_gru/infer", gzip.compress(b" " * (MAX_BYTES * 4)), {"Content-Encoding": "gzip"}, 413, ["decompressed"]),
    ("encoding", "POST", "/v2/models/kws_gru/infer", json.dumps(GOOD).encode(), {"Content-Encoding": "br"}, 415, ["'br'"]),
    ("sequence on a stateless model", "POST", "/v2/models/kws_gru/infer", {**GOOD, "parameters": {"sequence_id": 5, "sequence_start": True}},
     {}, 400, ["no state inputs", "--state"]),
    ("bad sequence flag", "POST", "/v2/models/kws_gru/infer", {**GOOD, "parameters": {"sequence_id": 5, "sequence_start": "yes"}},
     {}, 400, ["sequence_start"]),
    ("state input missing", "POST", "/v2/models/streaming_lstm/infer",
     {"inputs": [{"name": "chunk", "shape": [1, 1, 40], "datatype": "FP32", "data": [0.0] * 40}]}, {}, 400, ["'h_in'", "sequence_id"]),
    ("sequence never started", "POST", "/v2/models/streaming_lstm/infer",
     {"parameters": {"sequence_id": 77}, "inputs": [{"name": "chunk", "shape": [1, 1, 40], "datatype": "FP32", "data": [0.0] * 40}]},
     {}, 400, ["sequence 77", "sequence_start"]),
    ("sequence_lens out of range", "POST", "/v2/models/rnn_forecast/infer",
     {"inputs": [{"name": "series", "shape": [2, 1, 8], "datatype": "FP32", "data": [0.0] * 16},
                 {"name": "lengths", "shape": [1], "datatype": "INT32", "data": [9]}]}, {}, 400, ["'lengths'", "[1, 2]"]),
    ("integer out of range", "POST", "/v2/models/rnn_forecast/infer",
     {"inputs": [{"name": "series", "shape": [2, 1, 8], "datatype": "FP32", "data": [0.0] * 16},
                 {"name": "lengths", "shape": [1], "datatype": "INT32", "data": [2**40]}]}, {}, 400, ["range of INT32"]),
    ("token id beyond the vocabulary", "POST", "/v2/models/lstm_lm/infer",
     {"inputs": [{"name": "tokens", "shape": [2, 1], "datatype": "INT64", "data": [10**9, -7]}]}, {}, 400, ["'tokens'", "[-1000, 999]"]),
]


@pytest.mark.parametrize("method,path,body,headers,status,words", [pytest.param(*case[1:], id=case[0]) for case in BAD])
def test_bad_request_gets_a_v2_error_and_the_next_request_succeeds(client, reference, method, path, body, headers, status, words):
    if headers.get("Inference-Header-Content-Length") == "HEAD":  # the JSON head's length, as a client computes it
        headers = {**headers, "Inference-Header-Content-Length": str(body.index(b"\0") if b"\0" in body else len(body))}
    kwargs = {"json": body} if isinstance(body, dict) else {"content": body} if body is not None else {}
    r = client.request(method, path, headers=headers, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    message = r.json()["error"]
    for w in words:
        assert w in message, (w, message)
    # the server is still up and answers a good request to the same model
    model = path.split("/")[3] if path.startswith("/v2/models/") and path.split("/")[3] in MODELS else "kws_gru"
    good = {"kws_gru": kws_input(9), "rnn_forecast": forecast_input(9, 4), "lstm_lm": {"tokens": np.array([[3], [4]], "int64")},
            "streaming_lstm": {"chunk": np.ones((2, 1, 40), "float32"), "h_in": np.zeros((1, 1, 96), "float32"),
                               "c_in": np.zeros((1, 1, 96), "float32")}}[model]
    assert_close(as_arrays(infer(client, model, good)), reference[model].run(good))
    if path.startswith("/v2/models/nope/infer"):  # unknown models count under model="": clients cannot grow the label set
        assert 'tvmrnn_request_errors_total{model="",status="404"}' in client.get("/metrics").text


def test_error_metrics(client):
    text = client.get("/metrics").text
    assert 'tvmrnn_request_errors_total{model="kws_gru",status="400"}' in text
    assert 'tvmrnn_requests_total{model="kws_gru",status="200"}' in text


# -- start-up errors, thread isolation ---------------------------------------------------------------
def test_start_up_errors(tmp_path, modules):
    from tvmrnn.interface.serve import ServeArgs, resolve
    from tvmrnn.serve import ServeConfig, load_models

    with pytest.raises(InputError, match="does not exist"):
        load_models([str(tmp_path / "missing.so")], ServeConfig())
    with pytest.raises(InputError, match="both named 'kws_gru'"):
        load_models([modules["kws_gru"], modules["kws_gru"]], ServeConfig())
    with pytest.raises(InputError, match="--state names model 'other'"):
        load_models([modules["kws_gru"]], ServeConfig(state={"other": [("a", "b")]}))
    with pytest.raises(InputError, match="MODEL:INPUT=OUTPUT"):
        resolve(ServeArgs((modules["kws_gru"],), state=("h_in=h_out",)))
    with pytest.raises(InputError, match="--max-batch-size"):
        resolve(ServeArgs((modules["kws_gru"],), max_batch_size=0))


def test_state_pairs_rule_and_option(modules):
    from tvmrnn.runtime import metadata_path
    from tvmrnn.serve.signature import build_signature

    with open(metadata_path(modules["streaming_lstm"])) as f:
        meta = json.load(f)
    assert build_signature("s", meta).state_pairs == [("h_in", "h_out"), ("c_in", "c_out")]
    assert build_signature("s", meta, [("c_in", "c_out")]).state_pairs == [("c_in", "c_out")]
    with pytest.raises(InputError, match="'chunk' .* differ"):
        build_signature("s", meta, [("chunk", "h_out")])
    sig = build_signature("s", meta)
    assert sig.batch_dim == "batch" and sig.axes["batch"] == {"chunk": 1, "h_in": 1, "c_in": 1, "out": 1, "h_out": 1, "c_out": 1}


def test_merged_batches_stay_within_the_modules_batch_bound(modules):
    """A module compiled with max_dims (its buffers and CUDA graphs planned for them) caps the rows the batcher merges."""
    from tvmrnn.runtime import metadata_path
    from tvmrnn.serve.signature import build_signature

    with open(metadata_path(modules["streaming_lstm"])) as f:
        meta = json.load(f)
    assert build_signature("s", meta).batch_limit(16) == 16
    assert build_signature("s", {**meta, "max_dims": {"batch": 6, "seq": 100}}).batch_limit(16) == 6
    assert build_signature("s", {**meta, "max_dims": {"batch": 64}}).batch_limit(16) == 16


def test_thread_isolation(modules, reference):
    from tvmrnn.serve import ServeConfig, ServerThread, create_app, load_models

    config = ServeConfig(isolation="thread", max_delay_ms=1)
    with ServerThread(create_app(load_models([modules["kws_gru"]], config), config)) as srv, httpx.Client(base_url=srv.url) as c:
        feeds = kws_input(11)
        assert_close(as_arrays(infer(c, "kws_gru", feeds)), reference["kws_gru"].run(feeds))


def test_settled_heap_leaves_the_collector_little_to_walk():
    """A serving process settles its start-up heap (TVM, numpy, and torch, which tvm_ffi imports): a full collection over
    those ~250k objects paused it for tens to hundreds of ms, the tail of the latency at half rate."""
    code = ("import gc; import tvmrnn.serve.engine, tvmrnn.serve.repository; from tvmrnn.serve.workers import settle_heap; "
            "before = len(gc.get_objects()); settle_heap(); print(before, len(gc.get_objects()), gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout.split()
    before, after, frozen = map(int, out[-3:])
    assert before > 20000 and after < 1000 and frozen >= before - 1000, out


# -- tvmrnn serve in a subprocess: JSON logs, graceful shutdown ---------------------------------------
def test_graceful_shutdown_finishes_in_flight_requests(modules, reference):
    """SIGTERM while a request waits in its batch (max delay 1.5 s): it is answered, then the server stops cleanly."""
    code = ("import sys; from tvmrnn.interface.serve import ServeArgs, serve_command; "
            "serve_command(ServeArgs((sys.argv[1],), port=0, max_delay_ms=1500, graceful_timeout_s=20))")
    proc = subprocess.Popen([sys.executable, "-c", code, modules["kws_gru"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"on (http://[\d.]+:\d+)/v2", line)
            if m:
                url = m.group(1)
                break
        assert url, proc.stderr.read()
        with httpx.Client(base_url=url, timeout=30) as c:
            deadline = time.monotonic() + 30
            while c.get("/v2/health/ready").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            feeds = kws_input(12)
            result = {}
            t = threading.Thread(target=lambda: result.setdefault("r", infer(c, "kws_gru", feeds, check=False)))
            t.start()
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            t.join(30)
        assert result["r"].status_code == 200, result["r"].text
        assert_close(as_arrays(result["r"]), reference["kws_gru"].run(feeds))
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM once it has shut down cleanly
        logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
        events = [rec["msg"] for rec in logs]
        assert "model loaded" in events and "infer" in events and "stopped" in events
        infer_log = next(rec for rec in logs if rec["msg"] == "infer")
        assert infer_log["model"] == "kws_gru" and infer_log["status"] == 200
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_cli_server(paths, *options):
    proc = subprocess.Popen([sys.executable, "-m", "tvmrnn", "serve", *paths, "--port", "0", *options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))))
    for line in proc.stdout:
        m = re.search(r"on (http://[\d.]+:\d+)/v2", line)
        if m:
            break
    else:
        raise AssertionError(proc.stderr.read())
    deadline = time.monotonic() + 300
    while True:  # HTTP workers may still be starting: the socket accepts, nobody answers yet
        try:
            if httpx.get(m.group(1) + "/v2/health/ready", timeout=60).status_code == 200:
                return proc, m.group(1)
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _children(proc, word):
    import psutil

    return [p for p in psutil.Process(proc.pid).children(recursive=True) if word in " ".join(p.cmdline())]


def test_http_workers_listen_on_sockets_of_their_own():
    """With SO_REUSEPORT each HTTP worker gets a socket of its own on the port, and the kernel spreads connections over
    them (one shared socket went to whichever worker woke first: 65% of them to one of 4 workers, none to another)."""
    import socket as socketlib

    from tvmrnn.serve.cluster import _worker_sockets
    from tvmrnn.serve.server import bind

    shared = bind("127.0.0.1", 0)
    assert _worker_sockets(shared, 3) == [shared] * 3
    shared.close()
    first = bind("127.0.0.1", 0, reuse_port=True)
    listening = _worker_sockets(first, 2)
    port = first.getsockname()[1]
    assert len({s.fileno() for s in listening}) == 2 and {s.getsockname()[1] for s in listening} == {port}
    clients = [socketlib.create_connection(("127.0.0.1", port)) for _ in range(32)]
    accepted = []
    for s in listening:
        s.setblocking(False)
        n = 0
        while True:
            try:
                conn, _ = s.accept()
            except BlockingIOError:
                break
            conn.close()
            n += 1
        accepted.append(n)
    for c in clients + listening:
        c.close()
    assert sum(accepted) == 32 and min(accepted) >= 4, accepted


def test_a_response_leaves_in_one_write():
    """uvicorn writes a response's head and its body separately: the server's transport holds the writes of one turn of
    the event loop and sends them with one writelines; closing sends what it holds first."""
    from tvmrnn.serve.server import _CoalescedWrites

    class Transport:
        def __init__(self):
            self.calls = []

        def writelines(self, chunks):
            self.calls.append(("writelines", list(chunks)))

        def close(self):
            self.calls.append(("close",))

        def is_closing(self):
            return False

        def get_extra_info(self, name):
            return name

    async def scenario():
        raw = Transport()
        t = _CoalescedWrites(raw, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        t.write(b"body")
        assert raw.calls == [] and t.get_extra_info("peername") == "peername"
        await asyncio.sleep(0)
        assert raw.calls == [("writelines", [b"HTTP/1.1 200 OK\r\n\r\n", b"body"])]
        t.write(b"last")
        t.close()
        assert raw.calls[1:] == [("writelines", [b"last"]), ("close",)]
        await asyncio.sleep(0)
        assert len(raw.calls) == 3  # nothing left to send after the close

    asyncio.run(scenario())


def test_http_workers_share_one_engine_per_model(modules, reference):
    """--http-workers 2: requests over many connections (so both workers) are batched together by the model's engine, a
    sequence's chunks on fresh connections keep their state, bad requests get 4xx, an engine that dies is restarted, and
    SIGTERM stops every process."""
    paths = [modules[n] for n in ("kws_gru", "streaming_lstm", "lstm_lm")]
    proc, url = _start_cli_server(paths, "--http-workers", "2", "--max-delay-ms", "50", "--max-batch-size", "16")
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            assert len(_children(proc, "tvmrnn.serve.cluster")) == 2 and len(_children(proc, "tvmrnn.serve.engine")) == 3
            feeds_list = [kws_input(400 + i) for i in range(24)]
            for feeds, r in zip(feeds_list, _concurrently(type("S", (), {"url": url}), "kws_gru", feeds_list)):
                assert r.status_code == 200, r.text
                assert_close(as_arrays(r), reference["kws_gru"].run(feeds))
            stats = c.get("/v2/models/kws_gru/stats").json()["model_stats"][0]
            assert stats["inference_count"] == 24 and stats["execution_count"] < 24, stats  # one engine batched for both workers
            audio = np.random.default_rng(15).standard_normal((12, 1, 40)).astype("float32")
            outs = []
            for i, chunk in enumerate(np.split(audio, 4)):
                with httpx.Client(base_url=url, timeout=60) as fresh:  # a new connection each: any worker
                    params = {"sequence_id": "w", "sequence_start": i == 0, "sequence_end": i == 3}
                    outs.append(as_arrays(infer(fresh, "streaming_lstm", {"chunk": chunk}, params))["out"])
            zeros = np.zeros((1, 1, 96), "float32")
            want = reference["streaming_lstm"].run({"chunk": audio, "h_in": zeros, "c_in": zeros})["out"]
            np.testing.assert_allclose(np.concatenate(outs), want, rtol=1e-4, atol=1e-5)
            bad = infer(c, "lstm_lm", {"tokens": np.array([[10**6]], "int64")}, check=False)
            assert bad.status_code == 400 and "[-1000, 999]" in bad.json()["error"]
            assert c.post("/v2/models/kws_gru/infer", content=b"{").status_code == 400
            tokens = {"tokens": np.array([[3], [4]], "int64")}
            assert_close(as_arrays(infer(c, "lstm_lm", tokens)), reference["lstm_lm"].run(tokens))
            (engine,) = [p for p in _children(proc, "tvmrnn.serve.engine") if "kws_gru" in " ".join(p.cmdline())]
            engine.kill()
            deadline = time.monotonic() + 120
            while infer(c, "kws_gru", feeds_list[0], check=False).status_code != 200:  # 503 until it is back
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert_close(as_arrays(infer(c, "kws_gru", feeds_list[0])), reference["kws_gru"].run(feeds_list[0]))
        children = _children(proc, "tvmrnn.serve")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not any(p.is_running() and p.status() != "zombie" for p in children)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- an existing v2 client ---------------------------------------------------------------------------
def test_load_clients_answers_latencies_and_a_closed_connection(server, reference):
    """benchmarks/load_client.py, the load test's clients: every answer in closed and open loop, one latency per request,
    the open loop at its rate; a connection the server closes fails the rest of its stream and a new one goes on."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from load_client import encode_post, run_load

    host, port = server.host, server.port
    feeds = [kws_input(seed) for seed in range(24)]

    def wire(f, extra=None):
        body, headers = _binary_request(f)
        return encode_post(f"{host}:{port}", "/v2/models/kws_gru/infer", body, {**headers, **(extra or {})})

    def check(answer, f):
        status, header_length, body = answer
        assert status == 200
        n = int(header_length)
        out = np.frombuffer(body[n:], "float32").reshape(json.loads(body[:n])["outputs"][0]["shape"])
        assert_close({"keyword_logits": out}, reference["kws_gru"].run(f))

    streams = [[wire(feeds[2 * k]), wire(feeds[2 * k + 1])] for k in range(12)]
    for rate in (None, 100.0):
        load, start, end, cpu = run_load(host, port, streams, 4, rate)
        assert len(load.times) == 24 and cpu > 0
        for k in range(12):
            for i in range(2):
                check(load.answers[k][i], feeds[2 * k + i])
    assert 0.2 < end - start < 2.0, end - start  # 24 requests at 100/s: 0.23 s and the last one's latency
    closing = [[wire(feeds[0], {"Connection": "close"}), wire(feeds[1])], [wire(feeds[2]), wire(feeds[3])]]
    load, *_ = run_load(host, port, closing, 1, None)
    check(load.answers[0][0], feeds[0])
    assert load.answers[0][1] is None
    check(load.answers[1][0], feeds[2])
    check(load.answers[1][1], feeds[3])


def test_tritonclient_http(server, reference):
    import tritonclient.http as httpclient  # in the [test] extra: a missing one fails here, never skips
    c = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("kws_gru")
    assert c.get_model_metadata("kws_gru")["inputs"][0]["datatype"] == "FP32"
    feeds = kws_input(13, batch=2)
    for binary in (True, False):
        inp = httpclient.InferInput("mfcc", list(feeds["mfcc"].shape), "FP32")
        inp.set_data_from_numpy(feeds["mfcc"], binary_data=binary)
        res = c.infer("kws_gru", [inp], outputs=[httpclient.InferRequestedOutput("keyword_logits", binary_data=binary)])
        assert_close({"keyword_logits": res.as_numpy("keyword_logits")}, reference["kws_gru"].run(feeds))
    # streaming with tritonclient's own sequence arguments
    audio = np.random.default_rng(14).standard_normal((12, 1, 40)).astype("float32")
    outs = []
    for i, chunk in enumerate(np.split(audio, 3)):
        inp = httpclient.InferInput("chunk", list(chunk.shape), "FP32")
        inp.set_data_from_numpy(chunk)
        res = c.infer("streaming_lstm", [inp], sequence_id=31337, sequence_start=i == 0, sequence_end=i == 2)
        outs.append(res.as_numpy("out"))
    zeros = np.zeros((1, 1, 96), "float32")
    want = reference["streaming_lstm"].run({"chunk": audio, "h_in": zeros, "c_in": zeros})["out"]
    np.testing.assert_allclose(np.concatenate(outs), want, rtol=1e-4, atol=1e-5)
    c.close()


def test_triton_config_and_stats_routes(server, client, reference):
    """tritonclient's get_model_config and get_inference_statistics, against what the server did."""
    import tritonclient.http as httpclient  # in the [test] extra: a missing one fails here, never skips
    c = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    kws = c.get_model_config("kws_gru")
    assert kws["name"] == "kws_gru" and kws["backend"] == "tvmrnn" and kws["max_batch_size"] == 16  # the server's limit
    assert kws["input"] == [{"name": "mfcc", "data_type": "TYPE_FP32", "dims": [-1, 40]}]  # batch axis 0: left out, as Triton
    assert kws["output"] == [{"name": "keyword_logits", "data_type": "TYPE_FP32", "dims": [12]}]
    assert kws["dynamic_batching"]["max_queue_delay_microseconds"] == 20000 and "sequence_batching" not in kws
    stream = c.get_model_config("streaming_lstm", model_version="1")
    assert stream["max_batch_size"] == 0 and stream["parameters"]["batch_dim"]["string_value"] == "batch"  # batched on axis 1
    assert stream["input"][0] == {"name": "chunk", "data_type": "TYPE_FP32", "dims": [-1, -1, 40]}
    assert [(s["input_name"], s["output_name"]) for s in stream["sequence_batching"]["state"]] == [("h_in", "h_out"), ("c_in", "c_out")]
    assert c.get_model_config("lstm_lm")["input"][0]["data_type"] == "TYPE_INT64"

    def stats():
        (entry,) = c.get_inference_statistics("kws_gru")["model_stats"]
        return entry

    before = stats()
    feeds_list = [kws_input(300 + i) for i in range(8)]
    for feeds, r in zip(feeds_list, _concurrently(server, "kws_gru", feeds_list)):
        assert r.status_code == 200, r.text
    infer(client, "kws_gru", {"mfcc": np.zeros((1, 2, 41), "float32")}, check=False)  # a failure
    after = stats()
    got = after["inference_stats"]
    assert after["name"] == "kws_gru" and after["inference_count"] - before["inference_count"] == 8
    assert 1 <= after["execution_count"] - before["execution_count"] <= 8
    assert got["success"]["count"] - before["inference_stats"]["success"]["count"] == 8
    assert got["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert got[key]["count"] - before["inference_stats"][key]["count"] == 8, key
        assert got[key]["ns"] > before["inference_stats"][key]["ns"], key
    assert got["success"]["ns"] > got["compute_infer"]["ns"] > 0
    assert {m["name"] for m in c.get_inference_statistics()["model_stats"]} == set(MODELS)
    r = client.get("/v2/models/nope/config")
    assert r.status_code == 404 and "nope" in r.json()["error"]
    c.close()


def test_responses_carry_every_v2_datatype_in_json_and_binary():
    """Outputs are written by orjson straight from numpy (JSON) or as raw little-endian bytes (binary); both read back
    exactly for every v2 datatype, and a NaN, which JSON cannot hold, is written as null."""
    from tvmrnn.serve.protocol import HEADER_LENGTH, V2_TO_NUMPY, encode_infer_response

    for v2, dtype in V2_TO_NUMPY.items():
        out = {"y": (np.arange(6).reshape(2, 3) % 3).astype(dtype)}
        doc = json.loads(encode_infer_response("m", "1", "r", out, None, False)[0])
        (entry,) = doc["outputs"]
        assert entry["datatype"] == v2 and entry["shape"] == [2, 3] and doc["id"] == "r"
        np.testing.assert_array_equal(np.asarray(entry["data"], dtype).reshape(2, 3), out["y"])
        body, headers = encode_infer_response("m", "1", None, out, None, True)
        n = int(headers[HEADER_LENGTH])
        np.testing.assert_array_equal(np.frombuffer(body[n:], np.dtype(dtype).newbyteorder("<")).reshape(2, 3), out["y"])
    body, _ = encode_infer_response("m", "1", None, {"y": np.array([0.5, np.nan], "float32")}, None, False)
    assert json.loads(body)["outputs"][0]["data"] == [0.5, None]


def test_frame_reader_cuts_a_stream_into_frames_however_it_arrives():
    """Frames back to back on a socket arrive in arbitrary pieces: every one comes out whole, in order, with its tensors
    and its request fields."""
    from tvmrnn.serve.frames import FrameReader, decode_request, encode_request

    def tensors(i):
        return {"x": np.arange(i * 7, dtype="float32").reshape(i, 7), "n": np.array(i, "int64"), "t": np.ones((2, 4))[:, ::2]}

    def sid(i):
        return None if i % 3 == 0 else f"s{i}" if i % 3 == 1 else i

    stream = b"".join(encode_request(i, tensors(i), sid(i), i % 2 == 0, i % 5 == 0, i % 4 == 0) for i in range(40))
    rng = np.random.default_rng(3)
    for sizes in ([len(stream)], [1] * 50 + [len(stream)], rng.integers(1, 3000, 400).tolist()):
        reader, frames, pos = FrameReader(), [], 0
        for size in sizes:
            frames += reader.feed(stream[pos:pos + size])
            pos += size
        decoded = [decode_request(head, data) for head, data in frames]
        assert [d[:5] for d in decoded] == [(i, sid(i), i % 2 == 0, i % 5 == 0, i % 4 == 0) for i in range(40)]
        for i, (*_, feeds) in enumerate(decoded):
            assert list(feeds) == list(tensors(i))
            for name, want in tensors(i).items():
                np.testing.assert_array_equal(feeds[name], want)
                assert feeds[name].dtype == want.dtype


def test_a_batchs_answers_to_one_worker_are_one_frame_cut_back_into_each_requests_rows(modules):
    """An engine answers the requests of one HTTP worker in a batch with their rows gathered into one frame (padded ones
    at the batch's length); the worker's cut of it equals each request's own split, and errors carry status and message."""
    from tvmrnn.runtime import metadata_path
    from tvmrnn.serve.frames import FrameReader, decode_answers, decode_error, encode_answers, encode_error
    from tvmrnn.serve.signature import BatchOutputs, build_signature

    with open(metadata_path(modules["rnn_forecast"])) as f:
        metadata = json.load(f)
    metadata["outputs"].append({"name": "y", "dtype": "float32", "shape": ["seq", "batch", 3]})  # padded, batch on axis 1
    sig = build_signature("f", metadata)
    requests = [forecast_input(1, 3, batch=2), forecast_input(2, 5), forecast_input(3, 4), forecast_input(4, 2, batch=3)]
    _, plan = sig.merge(requests, 8, None)
    rng = np.random.default_rng(5)
    outputs = [rng.standard_normal((8, 4)).astype("float32"), rng.standard_normal((5, 8, 3)).astype("float32")]
    batch = BatchOutputs(sig, outputs, plan)
    for indices in ([3, 0, 2], [1, 2], [0, 1, 2, 3]):
        rows, lengths, gathered = batch.gather(indices)
        (head, data), = FrameReader().feed(encode_answers([10 + i for i in indices], rows, lengths, gathered))
        ids, rows, lengths, views = decode_answers(head, data)
        assert ids == [10 + i for i in indices]
        start = 0
        for i, n, length in zip(indices, rows, lengths):
            mine = sig.take_rows(views, start, n, length)
            start += n
            for name, want in batch.request(i).items():
                np.testing.assert_array_equal(mine[name], want)
    (head, _), = FrameReader().feed(encode_error(7, 429, "too many sequences: é"))
    assert decode_error(head) == (7, 429, "too many sequences: é")


def test_histogram_updates_in_bulk_equal_one_by_one():
    """`observe_many` (a batch's queue times, a turn's request times) leaves a histogram as one observe per value would."""
    from prometheus_client import CollectorRegistry, Histogram

    from tvmrnn.serve.metrics import observe_many

    values = [0.0001, 0.00025, 0.0, 5.0, 20.0, *np.random.default_rng(0).random(200) ** 4]
    samples = []
    for bulk in (False, True):
        registry = CollectorRegistry()
        child = Histogram("h", "h", ["m"], buckets=(0.0001, 0.00025, 0.001, 0.01, 1.0, 10.0), registry=registry).labels("x")
        if bulk:
            observe_many(child, values)
        else:
            for v in values:
                child.observe(v)
        samples.append({(s.name, s.labels.get("le")): s.value for f in registry.collect() for s in f.samples if "created" not in s.name})
    assert samples[0].keys() == samples[1].keys() and samples[0][("h_count", None)] == len(values)
    for key, value in samples[0].items():
        assert samples[1][key] == pytest.approx(value), key


class _RowsRunner:
    """Answers a kws_gru batch with each row's first feature (no module): which rows ran together, in which batch."""

    buckets, buffer, phases = False, None, {}

    def __init__(self):
        self.batches = []

    def run(self, inputs):
        self.batches.append(inputs[0].shape[0])
        return [np.repeat(inputs[0][:, :1, 0], 12, axis=1)]


def test_batcher_waits_for_a_full_batch_or_its_delay_and_answers_callbacks(modules):
    """A full batch runs at once (not after the delay); a lone request waits for the delay; `enqueue`'s callback gets
    its own rows, as `submit`'s awaiting caller does."""
    from tvmrnn.runtime import metadata_path
    from tvmrnn.serve.batcher import Batcher
    from tvmrnn.serve.metrics import Metrics
    from tvmrnn.serve.signature import build_signature

    with open(metadata_path(modules["kws_gru"])) as f:
        sig = build_signature("kws_gru", json.load(f))
    feeds = [{"mfcc": np.full((1, 3, 40), i, "float32")} for i in range(8)]

    async def main():
        runner = _RowsRunner()
        batcher = Batcher(sig, runner, 4, 0.5, Metrics(), split=False)
        batcher.start()
        delivered = {}
        t = time.perf_counter()
        for i in (0, 1):
            batcher.enqueue(feeds[i], lambda out, i=i: delivered.setdefault(i, out))
        got = await asyncio.gather(*(batcher.submit(f) for f in feeds[2:4]))  # the 4th row fills the batch
        full = time.perf_counter() - t
        t = time.perf_counter()
        alone = await batcher.submit(feeds[4])
        waited = time.perf_counter() - t
        await batcher.close()
        return runner.batches, delivered, got, alone, full, waited

    batches, delivered, got, alone, full, waited = asyncio.run(main())
    assert batches == [4, 1]
    assert full < 0.4 and 0.45 < waited < 2, (full, waited)
    assert [delivered[i].arrays()["keyword_logits"][0, 0] for i in (0, 1)] == [0, 1]
    assert [g["keyword_logits"][0, 0] for g in got] == [2, 3] and alone["keyword_logits"][0, 0] == 4


class _SlowRunner(_RowsRunner):
    """A model that takes `seconds` a batch with the GIL released, as a module does."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def run(self, inputs):
        time.sleep(self.seconds)
        return super().run(inputs)


def test_a_request_that_queued_during_a_batch_runs_next_without_waiting(modules):
    """A request that arrives while the model runs a batch starts the next batch as soon as that one ends, not after
    the batching delay; the event loop goes on meanwhile (the batch runs in the worker thread)."""
    from tvmrnn.runtime import metadata_path
    from tvmrnn.serve.batcher import Batcher
    from tvmrnn.serve.metrics import Metrics
    from tvmrnn.serve.signature import build_signature

    with open(metadata_path(modules["kws_gru"])) as f:
        sig = build_signature("kws_gru", json.load(f))
    feeds = [{"mfcc": np.full((1, 3, 40), i, "float32")} for i in range(2)]

    async def main():
        runner, ticks = _SlowRunner(0.4), []
        batcher = Batcher(sig, runner, 4, 0.6, Metrics())
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(feeds[0]))  # alone: runs after the delay, for 0.4 s
        await asyncio.sleep(0.8)  # the first batch is running now
        t = time.perf_counter()
        second = asyncio.ensure_future(batcher.submit(feeds[1]))
        while not first.done():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)
        out = await second
        waited = time.perf_counter() - t
        await batcher.close()
        return runner.batches, (await first)["keyword_logits"][0, 0], out["keyword_logits"][0, 0], waited, len(ticks)

    batches, first, second, waited, ticks = asyncio.run(main())
    assert batches == [1, 1] and (first, second) == (0, 1)
    assert 0.4 < waited < 0.9, waited  # the rest of the first batch and its own run; after the delay it would be > 1.0
    assert ticks > 5


def test_merge_pads_to_a_bucket_and_split_drops_the_filler(modules):
    """A GPU runner's batches are padded to a bucket of rows and assembled into kept buffers; lengths of filler rows are 1."""
    from tvmrnn.runtime import metadata_path
    from tvmrnn.serve.signature import build_signature

    with open(metadata_path(modules["rnn_forecast"])) as f:
        sig = build_signature("f", json.load(f))
    assert sig.pad_dim == "seq"
    kept = {}
    buffers = lambda name, shape, dtype: kept.setdefault((name, shape), np.full(shape, 7, dtype))  # noqa: E731
    requests = [forecast_input(1, 3, batch=2), forecast_input(2, 5)]
    merged, plan = sig.merge(requests, 4, buffers)
    series, lengths = merged
    assert series.shape == (5, 4, 8) and series is kept[("series", (5, 4, 8))] and plan.width == 4
    np.testing.assert_array_equal(series[:3, :2], requests[0]["series"])
    np.testing.assert_array_equal(series[3:, :2], 0)
    np.testing.assert_array_equal(series[:, 2:3], requests[1]["series"])
    np.testing.assert_array_equal(series[:, 3], 0)
    np.testing.assert_array_equal(lengths, [*requests[0]["lengths"], *requests[1]["lengths"], 1])
    forecast = np.arange(4 * 4, dtype="float32").reshape(4, 4)  # [batch, 4]: two rows, one row, one filler
    first, second = sig.split([forecast], plan)
    np.testing.assert_array_equal(first["forecast"], forecast[:2])
    np.testing.assert_array_equal(second["forecast"], forecast[2:3])
    assert second["forecast"].base is None  # an array of its own: the batch's buffers are reused


def test_bounded_module_is_served_within_its_bounds(tmp_path):
    """A module compiled with max_dims: a request past a bound gets 400 naming the dim, and concurrent requests are merged,
    but only up to the batch bound (a larger merged batch would be refused by the module), each answered right."""
    from tvmrnn.serve import ServeConfig, ServerThread, create_app, load_models

    path = str(tvmrnn.compile(os.path.join(REPO, "models", "kws_gru.onnx"), target="llvm", max_dims={"batch": 3, "time": 40})
               .export(tmp_path / "kws_bounded.so"))
    local = tvmrnn.load(path)
    config = ServeConfig(max_batch_size=16, max_delay_ms=50)
    with ServerThread(create_app(load_models([path], config), config)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        r = infer(c, "kws_bounded", kws_input(0, 1, 41), check=False)
        assert r.status_code == 400 and "time=41" in r.text and "time <= 40" in r.text, r.text
        feeds_list = [kws_input(200 + i, batch=1) for i in range(12)]
        for feeds, r in zip(feeds_list, _concurrently(srv, "kws_bounded", feeds_list)):
            assert r.status_code == 200, r.text
            assert_close(as_arrays(r), local.run(feeds))
        rows, batches = (metric(c, f"tvmrnn_batch_size_{s}", "kws_bounded") for s in ("sum", "count"))
        assert rows == 12 and batches >= 4 and rows / batches > 1.2, (rows, batches)  # merged, 3 rows at the most
