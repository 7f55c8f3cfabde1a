"""Probe: can a persistent kernel run in thread-block clusters, sharing shared memory across a cluster's blocks?

Why: every block of blog-a's and b64-h1024-l2's recurrent kernels reads all of h from L2 every step (blog-a: 84 MB of
the 184 MB a step moves). Blocks paired in a cluster could each copy half of a round's h and read the other half from
the partner's shared memory (distributed shared memory, DSMEM). That needs three things this probe checks on the GPU:
1. a cooperative launch (the grid barrier) with a cluster dimension (TVM's runtime passes both launch attributes to
   cuLaunchKernelEx when the kernel binds clusterCtaIdx.x and carries the cooperative tag);
2. a DSMEM load: mapa + ld.shared::cluster of the partner's element;
3. the grid barrier still working with clusters, and the cost of a cluster barrier per round.

    PYTHONPATH=. python3 benchmarks/probe_cluster.py        (GPU: runs and checks; without one: builds only)
"""

import sys

import numpy as np
import tvm
from tvm.script import tirx as T

from schedules import cooperative

G, TX, ROUNDS = 128, 256, 2000
PEER_LOAD = "tvmrnn_peer_load"
PEER_LOAD_SRC = f"""__forceinline__ __device__ float {PEER_LOAD}(float* p, unsigned rank) {{
  unsigned addr = (unsigned)__cvta_generic_to_shared(p), peer;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(peer) : "memory");
  return v;
}}"""


@T.prim_func
def probe(out_ptr: T.handle, after_ptr: T.handle):
    out = T.match_buffer(out_ptr, (G * TX,), "float32")
    after = T.match_buffer(after_ptr, (G * TX,), "float32")
    for rank in T.thread_binding(2, thread="clusterCtaIdx.x"):
        for bx in T.thread_binding(G, thread="blockIdx.x"):
            for tx in T.thread_binding(TX, thread="threadIdx.x"):
                s = T.alloc_buffer((TX,), "float32", scope="shared")
                s[tx] = T.float32(bx * 1000 + tx)
                T.cuda.cluster_sync()
                out[bx * TX + tx] = T.cuda.func_call(PEER_LOAD, T.address_of(s[(tx + 1) % TX]), T.uint32(1) - T.Cast("uint32", rank),
                                                     source_code=PEER_LOAD_SRC, return_type="float32")
                T.cuda.cluster_sync()  # the partner has read this block's s before either moves on
                T.cuda.grid_sync()
                after[bx * TX + tx] = out[(bx + 1) % G * TX + tx]


@T.prim_func
def barriers(out_ptr: T.handle, rounds: T.int32):
    out = T.match_buffer(out_ptr, (G * TX,), "float32")
    for rank in T.thread_binding(2, thread="clusterCtaIdx.x"):
        for bx in T.thread_binding(G, thread="blockIdx.x"):
            for tx in T.thread_binding(TX, thread="threadIdx.x"):
                s = T.alloc_buffer((TX,), "float32", scope="shared")
                s[tx] = T.float32(tx)
                for _ in range(rounds):
                    T.cuda.cluster_sync()
                    s[tx] = s[tx] + T.float32(1)
                out[bx * TX + tx] = s[tx] + T.Cast("float32", rank)


def build(func):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    return tvm.tirx.build(func, target=target, pipeline=cooperative.register())


def main():
    lib = build(probe)
    src = lib.imports[0].inspect_source()
    # the cluster's size is a launch attribute (the clusterCtaIdx.x binding's extent), not in the source
    print("reads its cluster rank:", "cluster_ctarank" in src, "| grid barrier:", "grid_sync" in src,
          "| DSMEM load:", PEER_LOAD in src)
    try:
        dev = tvm.cuda(0)
        dev_ok = dev.exist
    except Exception:  # noqa: BLE001 - no CUDA runtime here
        dev_ok = False
    if not dev_ok:
        print("no GPU: built only")
        return 0
    out = tvm.runtime.tensor(np.full(G * TX, np.nan, "float32"), dev)
    after = tvm.runtime.tensor(np.full(G * TX, np.nan, "float32"), dev)
    lib(out, after)
    bx, tx = np.divmod(np.arange(G * TX), TX)
    want = (bx ^ 1) * 1000 + (tx + 1) % TX  # the partner block (cluster of 2: blocks 2i, 2i + 1), the next element
    got = out.numpy()
    print("DSMEM load correct:", bool(np.array_equal(got, want)), "| grid barrier correct:",
          bool(np.array_equal(after.numpy(), np.roll(want.reshape(G, TX), -1, axis=0).ravel())))
    timed = build(barriers)
    timer = timed.time_evaluator(timed.entry_name, dev, number=5, repeat=3)
    t = min(timer(out, ROUNDS).results)
    print(f"cluster barrier: {t / ROUNDS * 1e6:.3f} us each ({ROUNDS} rounds, {G} blocks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
