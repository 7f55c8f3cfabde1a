"""The cluster kernel's µs per step beside the persistent kernel's and cuDNN's, on the step rows (batch 1 by default).

    python3 benchmarks/cluster_bench.py [ROW,ROW,...] [DTYPE,DTYPE] [--all] [--grid=QxCwW[bNB][pP],...] [--batch=KIND]
    (default: step-lstm-h256-b1, step-lstm-h512-b1, step-gru-h256-b1, step-gru-h512-b1; float32,float16)

One layer, input size = H, 1000 steps, timed as `tvmrnn bench` times a row (the whole model, input projection
included, replayed as one CUDA graph; cuDNN eager, from a CUDA graph and with its own algorithms, persistent ones
included, through cudnnRNNForward); a row step-CELL-hH-bB of any H and batch B. Ours: the persistent kind's default
point and the cluster kind's (schedules/recurrent_cluster.py: values staged and sent by st.async onto mbarriers), at 8
CTAs and with a cluster barrier a phase (sync 0); --all adds the persistent kind with sync 1 (staged, prefetched) and
the cluster kind with 8 warps. --grid=8x8w8,...: auto and the cluster kind's default (with the persistent kind, both
syncs, on batch-1 rows) beside Q clusters of C CTAs of W warps a direction (bNB: batch_tile NB; pP: P clusters running
batch chunks side by side, with Q = 1). --batch=KIND: auto beside KIND's default point (rows above batch 1: what auto
ran there before batch groups). Each (row, dtype) runs in a process of its own under a time limit (a wrong mbarrier
count would hang), so that a failed launch cannot take the other rows with it; every failure is printed in its cell
(a point whose R does not fit fails at launch).
"""

import json
import re
import subprocess
import sys

ROWS = ("step-lstm-h256-b1", "step-lstm-h512-b1", "step-gru-h256-b1", "step-gru-h512-b1")
DEFAULT = {"persistent": ("persistent", {}), "cluster": ("cluster", {}), "cluster 8 CTAs": ("cluster", {"ctas": 8}),
           "cluster barrier": ("cluster", {"sync": 0})}
MORE = {"persistent sync 1": ("persistent", {"sync": 1, "stage_h": True, "prefetch": 1}), "cluster 8 warps": ("cluster", {"warps": 8})}
CASE_S = 300  # a (row, dtype)'s process: a wrong mbarrier count would hang
# cuDNN's settings: each column the fastest of its keys present (fp32 exact and TF32 allowed, or fp16's tensor math)
CUDNN = {"cuDNN eager": ("cudnn_fp32_ms", "cudnn_tf32_ms"), "cuDNN graph": ("cudnn_graph_fp32_ms", "cudnn_graph_tf32_ms"),
         **{f"cuDNN persist. {a}": tuple(f"cudnn_persist_{a}_{m}_ms" for m in ("fma", "default", "tensor")) for a in ("static", "dynamic")}}


def row_of(name):
    """A step row of tvmrnn.bench, or any step-CELL-hH-bB of the same form."""
    import dataclasses

    from ab_default import parse_shape
    from tvmrnn.bench import STEP_ROWS

    known = {r.name: r for r in STEP_ROWS}
    return known[name] if name in known else dataclasses.replace(parse_shape(name.removeprefix("step-"))[0], name=name)


def one_case(name, dtype, variants):
    """Time one row at one dtype: a JSON line of each variant's µs per step, error against cuDNN, kernel or failure."""
    import traceback

    from ab_default import default_with_knobs
    from tvmrnn.bench import bench_gpu_row

    row, out, cudnn = row_of(name), {"row": name, "dtype": dtype, "variants": {}}, None
    for label, (kind, knobs) in variants.items():
        try:
            with default_with_knobs(kind, knobs):
                r = bench_gpu_row(row, kernels=(kind,), dtype=dtype, cudnn=cudnn)
            cudnn = cudnn or r
            out["variants"][label] = {"us": r[f"{kind}_ms"] * 1e3 / row.T if f"{kind}_ms" in r else None,
                                      "rel_err": r.get(f"{kind}_rel_err"), "kernel": r.get(f"{kind}_kernel")}
        except Exception as err:  # noqa: BLE001 - a case reports every failure and goes on
            out["variants"][label] = {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
            print(traceback.format_exc(), file=sys.stderr, flush=True)
    if cudnn is not None:
        out["cudnn"] = {label: min((cudnn[k] * 1e3 / row.T for k in keys if k in cudnn), default=None) for label, keys in CUDNN.items()}
        out["cudnn"]["best"] = f"{cudnn['best_cudnn_ms'] * 1e3 / row.T:.2f} ({cudnn['best_cudnn']})"
        out["cudnn_error"] = cudnn.get("cudnn_algorithms_error")
    print("CASE " + json.dumps(out), flush=True)


def cell(v):
    if "error" in v:
        return f"FAILED: {v['error']}"
    if v.get("us") is None:
        return f"n/a ({v.get('kernel')})"
    return f"{v['us']:.2f} ({v['rel_err']:.0e})"


def run_case(name, dtype, variants, timeout):
    """one_case in a process of its own: its result, or None (the failure printed as the row's line)."""
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", name, dtype, json.dumps(variants)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  {name} {dtype} {list(variants)}: timed out after {timeout} s", flush=True)
        return None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")), None)
    if line is None:
        print(f"| {name} | {dtype} | {list(variants)}: process failed (exit {proc.returncode}): "
              + " / ".join(proc.stderr.strip().splitlines()[-3:]) + " |", flush=True)
        return None
    return json.loads(line[5:])


def main(argv):
    flags = [a for a in argv if a.startswith("--")]
    args = [a for a in argv if not a.startswith("--")]
    rows = args[0].split(",") if args else list(ROWS)
    dtypes = args[1].split(",") if len(args) > 1 else ["float32", "float16"]
    variants = DEFAULT | (MORE if "--all" in flags else {})
    grids = next((f.split("=", 1)[1] for f in flags if f.startswith("--grid=")), None)
    before = next((f.split("=", 1)[1] for f in flags if f.startswith("--batch=")), None)
    if before:  # rows above batch 1: auto beside the kind it ran there before batch groups
        variants = {"auto": ("auto", {}), before: (before, {})}
    if grids:  # --grid=QxCwW,...: the persistent kind beside these grids of clusters
        variants = {"auto": ("auto", {}), "cluster": variants["cluster"]}
        if all(r.endswith("-b1") for r in rows):
            variants |= {"persistent": DEFAULT["persistent"], "persistent sync 1": MORE["persistent sync 1"]}
        for g in grids.split(","):
            q, c, w, nb, p = re.fullmatch(r"(\d+)x(\d+)w(\d+)(?:b(\d+))?(?:p(\d+))?", g).groups()
            variants[f"grid {g}"] = ("cluster", {"clusters": int(q), "ctas": int(c), "warps": int(w), "sync": 1,
                                                 "batch_tile": int(nb or 1), "batch_groups": int(p or 1)})
    print("| row | dtype | " + " | ".join(f"{v} µs/step (rel. err)" for v in variants) + " | "
          + " | ".join(CUDNN) + " | best cuDNN |")
    print("|---|---|" + "---|" * (len(variants) + len(CUDNN) + 1), flush=True)
    kernels = []
    for name in rows:
        for dtype in dtypes:
            case = run_case(name, dtype, variants, CASE_S)
            if case is None:
                continue
            us = lambda v: f"{v:.2f}" if v else "n/a"  # noqa: E731
            cudnn = case.get("cudnn", {})
            print(f"| {name} | {dtype} | " + " | ".join(cell(case["variants"][v]) for v in variants) + " | "
                  + " | ".join(us(cudnn.get(c)) for c in CUDNN) + f" | {cudnn.get('best', 'n/a')} |", flush=True)
            kernels += [f"{name} {dtype} {v}: {r.get('kernel') or r.get('error')}" for v, r in case["variants"].items()]
            if case.get("cudnn_error"):
                kernels.append(f"{name} {dtype} cuDNN algorithms: {case['cudnn_error']}")
    print("\n" + "\n".join(kernels))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one_case(sys.argv[2], sys.argv[3], {k: tuple(v) for k, v in json.loads(sys.argv[4]).items()})
    else:
        main(sys.argv[1:])
