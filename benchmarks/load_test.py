"""Load test of `tvmrnn serve` on loopback, against calling the module directly one request at a time.

    python benchmarks/load_test.py [--requests 2000] [--concurrency 64] [--max-batch-size 32] [--max-delay-ms 5]

Compiles models/kws_gru.onnx (stateless) and models/streaming_lstm.onnx (streaming) for the CPU ("llvm"),
starts `tvmrnn serve` on them in a subprocess on a free loopback port, then per model:

- **served**: `--concurrency` clients send `--requests` requests in all (binary tensors, as tritonclient
  does): kws_gru one utterance [1, T, 40] each; streaming_lstm `--concurrency` sequences at once, each
  a run of chunks [C, 1, 40] with sequence_start / sequence_end, the state kept by the server;
- **direct**: the same requests through `tvmrnn.load(...).run`, one at a time in this process (the
  streaming state carried by hand). Its outputs are the reference every served answer is checked against.

Prints and writes to benchmarks/results/DATE-serve-load.{json,md}: errors (non-200 or wrong answers;
must be 0), mean batch size (from the server's /metrics), p50/p99 latency and throughput of both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time

import aiohttp  # the client: httpx's async pool stalls at 64 connections (~130 req/s on 2 cores), aiohttp does not
import httpx
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import tvmrnn  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000, help="requests per model, all clients together")
    p.add_argument("--concurrency", type=int, default=64, help="clients (and, for the streaming model, live sequences) at once")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-delay-ms", type=float, default=5.0)
    p.add_argument("--frames", type=int, default=50, help="time steps of one kws_gru utterance")
    p.add_argument("--chunk", type=int, default=10, help="time steps of one streaming chunk")
    p.add_argument("--threads", type=int, default=None, help="TVM CPU threads per model worker (default: TVM's)")
    p.add_argument("--isolation", default="process", choices=["process", "thread"])
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    return p.parse_args()


# -- requests ----------------------------------------------------------------------------------------
def binary_request(feeds: dict[str, np.ndarray], parameters: dict | None = None) -> tuple[bytes, dict]:
    head = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}}
                       for n, a in feeds.items()],
            "parameters": {"binary_data_output": True, **(parameters or {})}}
    head_bytes = json.dumps(head).encode()
    return head_bytes + b"".join(a.tobytes() for a in feeds.values()), {
        "Inference-Header-Content-Length": str(len(head_bytes)), "Content-Type": "application/octet-stream"}


def binary_response(headers, content: bytes) -> dict[str, np.ndarray]:
    n = int(headers["Inference-Header-Content-Length"])
    head, offset, out = json.loads(content[:n]), n, {}
    for o in head["outputs"]:
        size = o["parameters"]["binary_data_size"]
        out[o["name"]] = np.frombuffer(content[offset:offset + size], "float32").reshape(o["shape"])
        offset += size
    return out


async def post(client: aiohttp.ClientSession, path: str, body: bytes, headers: dict, want: dict) -> tuple[float, bool]:
    """One infer request: (seconds, answered 200 with outputs equal to `want`)."""
    t = time.perf_counter()
    try:
        async with client.post(path, data=body, headers=headers) as r:
            content = await r.read()
            seconds = time.perf_counter() - t
            return seconds, r.status == 200 and close(binary_response(r.headers, content), want)
    except aiohttp.ClientError:
        return time.perf_counter() - t, False


def close(got: dict, want: dict) -> bool:
    return all(np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5) for k in want)


# -- the two workloads ----------------------------------------------------------------------------------
class Stateless:
    model = "kws_gru"

    def __init__(self, args, module):
        rng = np.random.default_rng(0)
        self.feeds = [{"mfcc": rng.standard_normal((1, args.frames, 40)).astype("float32")} for _ in range(args.requests)]
        self.module, self.concurrency = module, args.concurrency

    def direct(self) -> tuple[list[float], list[dict]]:
        times, outs = [], []
        for f in self.feeds:
            t = time.perf_counter()
            outs.append(self.module.run(f))
            times.append(time.perf_counter() - t)
        return times, outs

    async def served(self, client: aiohttp.ClientSession, reference: list[dict]) -> tuple[list[float], int]:
        next_index, times, errors = iter(range(len(self.feeds))), [], 0

        async def worker():
            nonlocal errors
            for i in next_index:
                body, headers = binary_request(self.feeds[i])
                seconds, ok = await post(client, f"/v2/models/{self.model}/infer", body, headers, reference[i])
                times.append(seconds)
                errors += not ok

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))
        return times, errors


class Streaming:
    model = "streaming_lstm"

    def __init__(self, args, module):
        rng = np.random.default_rng(1)
        n_seq = args.concurrency
        per_seq = [args.requests // n_seq + (k < args.requests % n_seq) for k in range(n_seq)]
        self.chunks = [[rng.standard_normal((args.chunk, 1, 40)).astype("float32") for _ in range(n)] for n in per_seq]
        self.module = module

    def direct(self) -> tuple[list[float], list[list[dict]]]:
        times, outs = [], []
        for seq in self.chunks:
            h = c = np.zeros((1, 1, 96), "float32")
            mine = []
            for chunk in seq:
                t = time.perf_counter()
                o = self.module.run({"chunk": chunk, "h_in": h, "c_in": c})
                times.append(time.perf_counter() - t)
                h, c = o["h_out"], o["c_out"]
                mine.append(o)
            outs.append(mine)
        return times, outs

    async def served(self, client: aiohttp.ClientSession, reference) -> tuple[list[float], int]:
        times, errors = [], 0

        async def sequence(k):
            nonlocal errors
            seq = self.chunks[k]
            for i, chunk in enumerate(seq):
                params = {"sequence_id": 1000 + k, "sequence_start": i == 0, "sequence_end": i == len(seq) - 1}
                body, headers = binary_request({"chunk": chunk}, params)
                seconds, ok = await post(client, f"/v2/models/{self.model}/infer", body, headers, reference[k][i])
                times.append(seconds)
                errors += not ok

        await asyncio.gather(*(sequence(k) for k in range(len(self.chunks))))
        return times, errors


# -- the server --------------------------------------------------------------------------------------
def start_server(paths: list[str], args) -> tuple[subprocess.Popen, str]:
    code = ("import sys; from tvmrnn.interface.serve import ServeArgs, serve_command; "
            f"serve_command(ServeArgs(tuple(sys.argv[1:]), port=0, max_batch_size={args.max_batch_size}, "
            f"max_delay_ms={args.max_delay_ms}, max_sequences={max(1024, args.concurrency)}, isolation={args.isolation!r}, "
            f"threads={args.threads}, log_level='warning'))")
    proc = subprocess.Popen([sys.executable, "-c", code, *paths], stdout=subprocess.PIPE, text=True, cwd=REPO)
    for line in proc.stdout:
        m = re.search(r"on (http://[\d.]+:\d+)/v2", line)
        if m:
            url = m.group(1)
            break
    else:
        raise SystemExit(f"the server did not start (exit code {proc.wait()})")
    deadline = time.monotonic() + 120
    while httpx.get(url + "/v2/health/ready").status_code != 200:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not get ready")
        time.sleep(0.1)
    return proc, url


def scrape(url: str, model: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for name in ("tvmrnn_batch_size_sum", "tvmrnn_batch_size_count", "tvmrnn_batch_requests_sum",
                 "tvmrnn_queue_seconds_sum", "tvmrnn_compute_seconds_sum", "tvmrnn_queue_seconds_count"):
        m = re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', text, re.MULTILINE)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def percentile(times: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(times) * 1000, q)) if times else float("nan")


async def run_served(work, url: str, concurrency: int, reference):
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:
        start = time.perf_counter()
        times, errors = await work.served(client, reference)
        return times, errors, time.perf_counter() - start


def main():
    args = parse_args()
    build = tempfile.mkdtemp(prefix="tvmrnn-load-")
    paths = {}
    for cls in (Stateless, Streaming):
        paths[cls.model] = str(tvmrnn.compile(os.path.join(REPO, "models", f"{cls.model}.onnx"), target="llvm")
                               .export(os.path.join(build, f"{cls.model}.so")))
    proc, url = start_server(list(paths.values()), args)
    results = []
    try:
        for cls in (Stateless, Streaming):
            work = cls(args, tvmrnn.load(paths[cls.model]))
            for f in (work.feeds[:20] if cls is Stateless else [{"chunk": work.chunks[0][0], "h_in": np.zeros((1, 1, 96), "float32"),
                                                                 "c_in": np.zeros((1, 1, 96), "float32")}] * 20):
                work.module.run(f)  # warm-up
            start = time.perf_counter()
            direct_times, reference = work.direct()
            direct_wall = time.perf_counter() - start
            before = scrape(url, cls.model)
            times, errors, wall = asyncio.run(run_served(work, url, args.concurrency, reference))
            after = scrape(url, cls.model)
            d = {k: after[k] - before[k] for k in after}
            n = len(direct_times)
            row = {
                "model": cls.model, "requests": n, "concurrency": args.concurrency, "errors": errors,
                "mean_batch_rows": d["tvmrnn_batch_size_sum"] / max(d["tvmrnn_batch_size_count"], 1),
                "batches": int(d["tvmrnn_batch_size_count"]),
                "served_p50_ms": percentile(times, 50), "served_p99_ms": percentile(times, 99),
                "served_rps": n / wall,
                "direct_p50_ms": percentile(direct_times, 50), "direct_p99_ms": percentile(direct_times, 99),
                "direct_rps": n / direct_wall,
                "mean_queue_ms": 1000 * d["tvmrnn_queue_seconds_sum"] / max(d["tvmrnn_queue_seconds_count"], 1),
                "mean_compute_ms_per_batch": 1000 * d["tvmrnn_compute_seconds_sum"] / max(d["tvmrnn_batch_size_count"], 1),
            }
            row["served_vs_direct_throughput"] = row["served_rps"] / row["direct_rps"]
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "tvmrnn": tvmrnn.__version__,
           "python": platform.python_version(), "host": platform.node(), "cores": os.cpu_count(), "target": "llvm",
           "max_batch_size": args.max_batch_size, "max_delay_ms": args.max_delay_ms, "isolation": args.isolation, "tvm_threads": args.threads or "default",
           "kws_frames": args.frames, "stream_chunk": args.chunk, "transport": "HTTP/1.1 loopback, binary tensors, aiohttp client"}
    command = "python benchmarks/load_test.py " + " ".join(sys.argv[1:])
    write(args.out, results, env, command)
    ok = all(r["errors"] == 0 for r in results)
    print("zero-error check:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


COLUMNS = [("model", "model"), ("requests", "requests"), ("concurrency", "clients"), ("errors", "errors"),
           ("mean_batch_rows", "mean batch"), ("served_p50_ms", "served p50 ms"), ("served_p99_ms", "served p99 ms"),
           ("served_rps", "served req/s"), ("direct_p50_ms", "direct p50 ms"), ("direct_p99_ms", "direct p99 ms"),
           ("direct_rps", "direct req/s"), ("served_vs_direct_throughput", "served ÷ direct"),
           ("mean_queue_ms", "queue ms"), ("mean_compute_ms_per_batch", "compute ms/batch")]


def write(out_dir: str, results: list[dict], env: dict, command: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{env['date'][:10]}-serve-load")
    with open(stem + ".json", "w") as f:
        json.dump({"environment": env, "command": command, "results": results}, f, indent=1)
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"Run {env['date']} with `{command}`", "", "```", json.dumps(env, indent=1), "```", "",
             "| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(r[k]) for k, _ in COLUMNS) + " |" for r in results]
    lines += ["", "served: through `tvmrnn serve` with dynamic batching, all clients at once; direct: `tvmrnn.load(...).run`, "
              "one request at a time in one process. Latencies are per request as the client saw them. "
              f"Zero-error check: {'PASS' if all(r['errors'] == 0 for r in results) else 'FAIL'}."]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
