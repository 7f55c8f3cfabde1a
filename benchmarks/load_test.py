"""Load test of `tvmrnn serve` on loopback, against calling the module directly one request at a time.

    python benchmarks/load_test.py [--target cpu|cuda] [--requests 2000] [--concurrency 64] [--max-batch-size 32]
        [--max-delay-ms 5] [--http-workers 1] [--client-procs 1] [--half-rate]

Compiles models/kws_gru.onnx (stateless) and models/streaming_lstm.onnx (streaming) for `--target` (cuda: with bounds
batch <= --max-batch-size and time <= --max-time, so the modules replay CUDA graphs), starts `tvmrnn serve` on them in a
subprocess on a free loopback port, then per model:

- **direct**: the requests through `tvmrnn.load(...).run`, one at a time in this process (the streaming state carried
  by hand). Its outputs are the reference every served answer is checked against;
- **served**: `--concurrency` clients in all (keep-alive connections, `load_client.py`: requests encoded before the
  clock starts, answers parsed with httptools, so a client costs the host little CPU; the table says how much), spread
  over `--client-procs` processes, send `--requests` requests in all after a warm-up (binary tensors, as
  tritonclient does): kws_gru one utterance [1, T, 40] each; streaming_lstm `--concurrency` sequences at once, each a
  run of chunks [C, 1, 40] with sequence_start / sequence_end, the state kept by the server;
- **half rate** (`--half-rate`): the same requests again, sent at half the served rate (open loop, each client process
  at its share of the rate), for the latency of a server that is not saturated. Latency runs from the time a request
  was due, not from when the client got round to sending it.

Errors are non-200 answers and answers that differ from the direct call's (rtol 1e-4, --atol). The profile section splits
a served request's time from the server's own statistics (/v2/models/NAME/stats and /metrics): queue, input (assembly and
copies to the device), infer, output (copies back and split), and the rest of a request's time in the server (HTTP,
decoding, the hop to the model's engine), and the CPU time per request of the server's HTTP workers, engines and model
workers, and of the client processes. Prints and writes benchmarks/results/DEVICE-serve-load.{json,md} (cpu, h100, ...).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import gc
import json
import multiprocessing
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import tvmrnn  # noqa: E402
from load_client import encode_post, run_load  # noqa: E402

MODELS = ("kws_gru", "streaming_lstm")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"], help="compile and serve the models for this device")
    p.add_argument("--requests", type=int, default=2000, help="requests per model, all clients together")
    p.add_argument("--concurrency", type=int, default=64, help="clients (and, for the streaming model, live sequences) at once")
    p.add_argument("--client-procs", type=int, default=1, help="processes the clients are spread over")
    p.add_argument("--http-workers", type=int, default=1, help="the server's HTTP worker processes (tvmrnn serve --http-workers)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-delay-ms", type=float, default=5.0)
    p.add_argument("--max-time", type=int, default=64, help="cuda: the modules' bound on the time dim (max_dims)")
    p.add_argument("--frames", type=int, default=50, help="time steps of one kws_gru utterance")
    p.add_argument("--chunk", type=int, default=10, help="time steps of one streaming chunk")
    p.add_argument("--threads", type=int, default=None, help="TVM CPU threads per model (default: TVM's)")
    p.add_argument("--isolation", default="auto", choices=["auto", "process", "thread"])
    p.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance of the answer check (rtol is 1e-4)")
    p.add_argument("--half-rate", action="store_true", help="also run at half the served rate, open loop")
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    return p.parse_args(argv)


# -- requests ----------------------------------------------------------------------------------------
def binary_request(feeds: dict[str, np.ndarray], parameters: dict | None = None) -> tuple[bytes, dict]:
    head = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}}
                       for n, a in feeds.items()],
            "parameters": {"binary_data_output": True, **(parameters or {})}}
    head_bytes = json.dumps(head).encode()
    return head_bytes + b"".join(a.tobytes() for a in feeds.values()), {
        "Inference-Header-Content-Length": str(len(head_bytes)), "Content-Type": "application/octet-stream"}


def binary_response(header_length: str, content: bytes) -> dict[str, np.ndarray]:
    n = int(header_length)
    head, offset, out = json.loads(content[:n]), n, {}
    for o in head["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(content[offset:offset + size], "float32").reshape(o["shape"])
        offset += size
    return out


def workload(model: str, args) -> list[list[tuple[dict, dict]]]:
    """Request streams, each sent by one client in order: [(feeds, parameters)]. kws_gru: single utterances;
    streaming_lstm: one stream per sequence, `--concurrency` sequences."""
    if model == "kws_gru":
        rng = np.random.default_rng(0)
        return [[({"mfcc": rng.standard_normal((1, args.frames, 40)).astype("float32")}, {})] for _ in range(args.requests)]
    rng = np.random.default_rng(1)
    n_seq = args.concurrency
    streams = []
    for k in range(n_seq):
        n = args.requests // n_seq + (k < args.requests % n_seq)
        streams.append([({"chunk": rng.standard_normal((args.chunk, 1, 40)).astype("float32")},
                         {"sequence_id": 1000 + k, "sequence_start": i == 0, "sequence_end": i == n - 1}) for i in range(n)])
    return streams


def direct(module, model: str, streams) -> tuple[list[float], list[list[dict]]]:
    """Each request through module.run, one at a time (state carried by hand): (seconds each, outputs per stream)."""
    times, outs = [], []
    for stream in streams:
        state = {"h_in": np.zeros((1, 1, 96), "float32"), "c_in": np.zeros((1, 1, 96), "float32")} if model != "kws_gru" else {}
        mine = []
        for feeds, _ in stream:
            t = time.perf_counter()
            o = module.run({**feeds, **state})
            times.append(time.perf_counter() - t)
            if state:
                state = {"h_in": o["h_out"], "c_in": o["c_out"]}
            mine.append(o)
        outs.append(mine)
    return times, outs


# -- the clients (in client processes) ------------------------------------------------------------------
def close(got: dict, want: dict, atol: float) -> bool:
    return all(k in got and np.allclose(got[k], want[k], rtol=1e-4, atol=atol) for k in want)


def answered_right(answer, want: dict, atol: float) -> bool:
    """answer: (HTTP status, Inference-Header-Content-Length, body), or None where the request failed."""
    return answer is not None and answer[0] == 200 and close(binary_response(answer[1], answer[2]), want, atol)


def settle_heap() -> None:
    """Leave what this process has allocated so far (it imported TVM, and torch with it) out of the collector's full
    collections, which would otherwise pause it mid-run for tens of ms (as `tvmrnn serve`'s processes do)."""
    gc.collect()
    gc.freeze()


def client_process(url, model, streams, reference, clients, rate, atol):
    """Send `streams` (see load_client.LoadRun), then check every answer: (latencies, send lags, errors, start and end
    time, this process's CPU seconds during the run). The bodies are built before the clock starts and the answers
    checked after it stops."""
    settle_heap()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    wires = [[encode_post(f"{host}:{port}", f"/v2/models/{model}/infer", *binary_request(feeds, params)) for feeds, params in stream]
             for stream in streams]
    load, start, end, cpu = run_load(host, int(port), wires, clients, rate)
    errors = sum(not answered_right(a, want, atol) for got, wants in zip(load.answers, reference) for a, want in zip(got, wants))
    return load.times, load.lags, errors, start, end, cpu


def served(pool, url: str, model: str, streams, reference, args, rate: float | None = None) -> dict:
    """The streams spread over the client processes: latencies, errors and the rate over the whole run."""
    procs = max(1, min(args.client_procs, len(streams)))
    share = [list(range(k, len(streams), procs)) for k in range(procs)]
    clients = [args.concurrency // procs + (k < args.concurrency % procs) for k in range(procs)]
    futures = [pool.submit(client_process, url, model, [streams[i] for i in idx], [reference[i] for i in idx], clients[k],
                           rate / procs if rate else None, args.atol) for k, idx in enumerate(share)]
    results = [f.result() for f in futures]
    times = [t for r in results for t in r[0]]
    wall = max(r[4] for r in results) - min(r[3] for r in results)
    return {"times": times, "lags": [t for r in results for t in r[1]], "errors": sum(r[2] for r in results),
            "rps": len(times) / wall, "client_cpu_us": 1e6 * sum(r[5] for r in results) / max(len(times), 1)}


# -- the server ----------------------------------------------------------------------------------------
def compile_models(args, build: str) -> dict[str, str]:
    target = "llvm" if args.target == "cpu" else "cuda"
    max_dims = {"batch": args.max_batch_size, "time": args.max_time} if args.target == "cuda" else None
    return {m: str(tvmrnn.compile(os.path.join(REPO, "models", f"{m}.onnx"), target=target, max_dims=max_dims)
                   .export(os.path.join(build, f"{m}.so"))) for m in MODELS}


def start_server(paths: list[str], args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "tvmrnn", "serve", *paths, "--port", "0", "--max-batch-size", str(args.max_batch_size),
           "--max-delay-ms", str(args.max_delay_ms), "--max-sequences", str(max(1024, args.concurrency)),
           "--isolation", args.isolation, "--http-workers", str(args.http_workers), "--log-level", "warning"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))))
    for line in proc.stdout:
        m = re.search(r"on (http://[\d.]+:\d+)/v2", line)
        if m:
            url = m.group(1)
            break
    else:
        raise SystemExit(f"the server did not start (exit code {proc.wait()})")
    deadline = time.monotonic() + 300
    while not _ready(url):  # HTTP workers may still be starting: the socket accepts, nobody answers yet
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
            raise SystemExit("the server did not get ready")
        time.sleep(0.1)
    return proc, url


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/v2/health/ready", timeout=60).status_code == 200
    except httpx.HTTPError:
        return False


def server_stats(url: str, model: str) -> dict[str, float]:
    """The server's own totals for `model`: Triton statistics (ns) and the per-batch phase sums of /metrics (s)."""
    (s,) = httpx.get(f"{url}/v2/models/{model}/stats").json()["model_stats"]
    out = {"batches": s["execution_count"], "rows": s["inference_count"]}
    for key, v in s["inference_stats"].items():
        out[f"{key}_count"], out[f"{key}_ns"] = v["count"], v["ns"]
    text = httpx.get(url + "/metrics").text
    for phase in ("input", "infer", "output"):
        m = re.search(rf'^tvmrnn_batch_phase_seconds_sum\{{model="{model}",phase="{phase}"\}} (\S+)$', text, re.MULTILINE)
        out[f"batch_{phase}_s"] = float(m.group(1)) if m else 0.0
    return out


def profile(before: dict, after: dict) -> dict:
    """Where a served request's time goes, in ms: per batch (input, infer, output) and per request (queue, the rest)."""
    d = {k: after[k] - before[k] for k in after}
    batches, requests = max(d["batches"], 1), max(d["success_count"], 1)
    batch = {p: 1000 * d[f"batch_{p}_s"] / batches for p in ("input", "infer", "output")}
    request_ms = d["success_ns"] / 1e6 / requests
    queue_ms = d["queue_ns"] / 1e6 / max(d["queue_count"], 1)
    return {"mean_batch_rows": d["rows"] / batches, "batches": int(d["batches"]), "request_in_server_ms": request_ms,
            "queue_ms": queue_ms, **{f"batch_{p}_ms": v for p, v in batch.items()},
            "http_and_hop_ms": request_ms - queue_ms - sum(batch.values())}


def percentile(times: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(times) * 1000, q)) if times else float("nan")


# -- the run -------------------------------------------------------------------------------------------
def server_cpu(server: subprocess.Popen, http_workers: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the server's processes, by role: http (the HTTP workers; with one, the
    whole server process), engine (a model's batching process), model_worker (a module in a process of its own)."""
    import psutil

    root = psutil.Process(server.pid)
    out = {"http": 0.0, "engine": 0.0, "model_worker": 0.0}
    for p in [root, *root.children(recursive=True)]:
        try:
            cmd, t = " ".join(p.cmdline()), p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        role = ("engine" if "tvmrnn.serve.engine" in cmd else "model_worker" if "tvmrnn.serve.workers" in cmd
                else "http" if p.pid != root.pid or http_workers == 1 else None)  # None: the supervisor of HTTP workers
        if role:
            out[role] += t.user + t.system
    return out


def measure(pool, url: str, model: str, paths, args, server: subprocess.Popen) -> dict:
    module = tvmrnn.load(paths[model])
    streams = workload(model, args)
    direct(module, model, streams[:2])  # warm-up
    start = time.perf_counter()
    direct_times, reference = direct(module, model, streams)
    direct_rps = len(direct_times) / (time.perf_counter() - start)
    warm = streams[: 2 * args.concurrency] if model == "kws_gru" else [s[:3] for s in streams]
    served(pool, url, model, warm, reference, args)  # warm-up: client processes started, batch shapes seen (CUDA graphs captured)
    before, cpu_before = server_stats(url, model), server_cpu(server, args.http_workers)
    peak = served(pool, url, model, streams, reference, args)
    cpu = server_cpu(server, args.http_workers)
    row = {"model": model, "requests": len(direct_times), "concurrency": args.concurrency, "errors": peak["errors"],
           "served_p50_ms": percentile(peak["times"], 50), "served_p99_ms": percentile(peak["times"], 99),
           "served_rps": peak["rps"], "direct_p50_ms": percentile(direct_times, 50),
           "direct_p99_ms": percentile(direct_times, 99), "direct_rps": direct_rps, "cpu_us_client": peak["client_cpu_us"]}
    row["served_vs_direct_throughput"] = row["served_rps"] / row["direct_rps"]
    row.update(profile(before, server_stats(url, model)))
    row.update({f"cpu_us_{role}": 1e6 * (cpu[role] - cpu_before[role]) / len(peak["times"]) for role in cpu})
    if args.half_rate:
        half = served(pool, url, model, streams, reference, args, rate=peak["rps"] / 2)
        row.update({"half_rate_rps": half["rps"], "half_rate_p50_ms": percentile(half["times"], 50),
                    "half_rate_p99_ms": percentile(half["times"], 99), "half_rate_errors": half["errors"],
                    "half_rate_lag_p99_ms": percentile(half["lags"], 99), "half_rate_cpu_us_client": half["client_cpu_us"]})
    return row


def device_label(target: str, name: str) -> str:
    """The results file's device: cpu, or the GPU's model (h100, a100, l4, ...)."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", name) if target == "cuda" else None
    return m.group(1).lower() if m else ("cpu" if target == "cpu" else "cuda")


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def device_name(target: str) -> str:
    if target == "cuda":
        import tvm

        return tvm.cuda(0).device_name
    with open("/proc/cpuinfo") as f:
        names = re.findall(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE)
    return f"{names[0] if names else platform.processor()} ({os.cpu_count()} logical CPUs)"


def main():
    args = parse_args()
    build = tempfile.mkdtemp(prefix="tvmrnn-load-")
    paths = compile_models(args, build)
    settle_heap()  # compiling left a large heap here: no full collection over it in the middle of the direct calls
    proc, url = start_server(list(paths.values()), args)
    results = []
    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold a CUDA context
    try:
        with concurrent.futures.ProcessPoolExecutor(args.client_procs, mp_context=ctx) as pool:
            for model in MODELS:
                results.append(measure(pool, url, model, paths, args, proc))
                print(json.dumps(results[-1]), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    meta = json.load(open(os.path.splitext(paths[MODELS[0]])[0] + ".json"))
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
           "tvmrnn": tvmrnn.__version__,
           "python": platform.python_version(), "host": platform.node(), "cores": os.cpu_count(),
           "target": meta["target"], "target_kind": meta["target_kind"], "device": device_name(args.target),
           "max_dims": meta.get("max_dims"), "cuda_graph": meta.get("cuda_graph"),
           "max_batch_size": args.max_batch_size, "max_delay_ms": args.max_delay_ms, "isolation": args.isolation,
           "http_workers": args.http_workers, "client_procs": args.client_procs, "tvm_threads": args.threads or "default",
           "kws_frames": args.frames, "stream_chunk": args.chunk, "transport": "HTTP/1.1 loopback, binary tensors, keep-alive clients (asyncio protocols, httptools)"}
    write(args.out, results, env, "python benchmarks/load_test.py " + " ".join(sys.argv[1:]), device_label(args.target, env["device"]))
    ok = all(r["errors"] == 0 and r.get("half_rate_errors", 0) == 0 for r in results)
    print("zero-error check:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


COLUMNS = [("model", "model"), ("requests", "requests"), ("concurrency", "clients"), ("errors", "errors"),
           ("mean_batch_rows", "mean batch"), ("served_p50_ms", "served p50 ms"), ("served_p99_ms", "served p99 ms"),
           ("served_rps", "served req/s"), ("direct_p50_ms", "direct p50 ms"), ("direct_p99_ms", "direct p99 ms"),
           ("direct_rps", "direct req/s"), ("served_vs_direct_throughput", "served ÷ direct")]
HALF_COLUMNS = [("half_rate_rps", "half-rate req/s"), ("half_rate_p50_ms", "p50 ms"), ("half_rate_p99_ms", "p99 ms"),
                ("half_rate_errors", "errors"), ("half_rate_lag_p99_ms", "client send lag p99 ms"),
                ("half_rate_cpu_us_client", "client CPU µs/req")]
PROFILE_COLUMNS = [("request_in_server_ms", "request in server ms"), ("queue_ms", "queue ms"), ("batch_input_ms", "input ms/batch"),
                   ("batch_infer_ms", "infer ms/batch"), ("batch_output_ms", "output ms/batch"),
                   ("http_and_hop_ms", "HTTP, decode, hop ms"), ("cpu_us_http", "HTTP CPU µs/req"),
                   ("cpu_us_engine", "engine CPU µs/req"), ("cpu_us_model_worker", "model worker CPU µs/req"),
                   ("cpu_us_client", "client CPU µs/req")]


def _table(results: list[dict], columns) -> list[str]:
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    return (["| " + " | ".join(["model"] * (columns[0][0] != "model") + [h for _, h in columns]) + " |",
             "|" + "---|" * (len(columns) + (columns[0][0] != "model"))]
            + ["| " + " | ".join([r["model"]] * (columns[0][0] != "model") + [fmt(r.get(k, "")) for k, _ in columns]) + " |"
               for r in results])


def write(out_dir: str, results: list[dict], env: dict, command: str, device: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{device}-serve-load")
    with open(stem + ".json", "w") as f:
        json.dump({"environment": env, "command": command, "results": results}, f, indent=1)
    lines = [f"Run {env['date']} at {env['commit']} with `{command}`", "", "```", json.dumps(env, indent=1), "```", "", *_table(results, COLUMNS)]
    if "half_rate_rps" in results[0]:
        lines += ["", "At half the served rate (open loop):", "", *_table(results, HALF_COLUMNS)]
    lines += ["", "Where a served request's time goes (the server's own statistics, means):", "", *_table(results, PROFILE_COLUMNS)]
    lines += ["", "served: through `tvmrnn serve` with dynamic batching, all clients at once; direct: `tvmrnn.load(...).run`, "
              "one request at a time in one process. Latencies are per request as the client saw them; at half rate from "
              "the time each request was due (client send lag: how late the client sent it). input: assembling "
              "a batch and copying it to the device; infer: the module to its end; output: copies back and the split per "
              "request; HTTP, decode, hop: the rest of a request's time in the server. CPU µs/req: user + system time of "
              "the server's processes of that role during the full-rate run, per request; client: the load generator's "
              "processes (which stand for clients on other machines). Zero-error check: "
              f"{'PASS' if all(r['errors'] == 0 and r.get('half_rate_errors', 0) == 0 for r in results) else 'FAIL'}."]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
