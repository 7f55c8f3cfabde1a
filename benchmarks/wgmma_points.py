"""The points of projection_wgmma that benchmarks/gemm_bench.py times and benchmarks/ptxas_usage.py checks for
registers and spills (no GPU), by mode: names as the benchmark prints them."""

from schedules.projection_wgmma import WgmmaConfig


def named(mode: str, configs) -> dict[str, WgmmaConfig]:
    """Each point by its name in the benchmark's table: mode, block, ring stages (and chunks per buffer in half
    precision), overlap, columns per store."""
    def name(c):
        k = f" k{c.k_chunks * 32}" if mode == "float16" or c.k_chunks > 1 else ""
        return (f"wgmma{'' if mode == 'float16' else ' ' + mode} {c.warpgroups * 64}x{c.bn} s{c.stages}{k}"
                f"{' overlap' if c.overlap else ''}{f' st{c.store_cols}' if c.store_cols > 1 else ''}"
                f"{' regs' if c.lo_w else ''}{f' g{c.group}' if c.group != 8 else ''}")
    return {name(c): c for c in configs}


# the warpgroup GEMM (fp16): block columns (the wgmma's N), warpgroups of 64 rows, ring stages, raster group
WGMMA = named("float16", (WgmmaConfig(), WgmmaConfig(stages=6, overlap=1), WgmmaConfig(k_chunks=2, stages=4, overlap=1),
                   WgmmaConfig(bn=256, stages=6, overlap=1), WgmmaConfig(bn=256, k_chunks=2, stages=3, overlap=1),
                   WgmmaConfig(bn=256, k_chunks=2, stages=4, overlap=1), WgmmaConfig(bn=256, warpgroups=1, k_chunks=2, stages=4, overlap=1),
                   # 256 x 128: four warpgroups (16 warps, 64 accumulators each) over the same 32K outputs as 128 x 256
                   WgmmaConfig(bn=128, warpgroups=4, k_chunks=2, stages=4, overlap=1), WgmmaConfig(bn=128, warpgroups=4, stages=6, overlap=1),
                   # the epilogue's loads and stores two and four columns at a time
                   WgmmaConfig(bn=256, k_chunks=2, stages=4, overlap=1, store_cols=2),
                   WgmmaConfig(bn=256, k_chunks=2, stages=4, overlap=1, store_cols=4),
                   # 128 columns storing two at a time: where 256 do not divide the gates (ds2's 3200), against
                   # projection_staged, which compile takes there (it stores pairs already); at 98 registers and up to 98 KB
                   # of ring two blocks share an SM, one's epilogue beside the other's main loop (ptxas: no spills)
                   WgmmaConfig(k_chunks=2, stages=4, overlap=1, store_cols=2), WgmmaConfig(stages=6, overlap=1, store_cols=2),
                   WgmmaConfig(stages=4, overlap=1, store_cols=2),
                   # four columns a store: with XW in fp16, where pairs write half a 32-byte sector per row (four lanes'
                   # 4 bytes), as fp32's scalar stores did; four columns make the sector whole again
                   WgmmaConfig(stages=4, overlap=1, store_cols=4),
                   # 64 x 256 blocks of one warpgroup (168 registers) with 60-80 KB of ring: two or three blocks share an
                   # SM, each one's barriers and epilogue beside the others' wgmma's (as 3xTF32's 64 x 128 gained)
                   WgmmaConfig(bn=256, warpgroups=1, stages=4, overlap=1, store_cols=2), WgmmaConfig(bn=256, warpgroups=1, k_chunks=2, stages=2, store_cols=2),
                   WgmmaConfig(bn=256, warpgroups=1, stages=3, overlap=1, store_cols=2),
                   # DEFAULT walking 4, 16, 32 M tiles per raster group instead of 8: a wave's patch of X against W's
                   WgmmaConfig(bn=256, k_chunks=2, stages=4, overlap=1, store_cols=2, group=4),
                   WgmmaConfig(bn=256, k_chunks=2, stages=4, overlap=1, store_cols=2, group=16),
                   WgmmaConfig(bn=256, k_chunks=2, stages=4, overlap=1, store_cols=2, group=32),
                   # one warpgroup over 160 or 128 columns, two chunks a buffer (f16x3's best points, 14-28 KB a buffer,
                   # 80 or 64 accumulators: two or three blocks an SM), with and without the next buffer's wgmma's issued
                   # early, storing two or four columns
                   WgmmaConfig(bn=160, warpgroups=1, k_chunks=2, stages=2, store_cols=2), WgmmaConfig(bn=160, warpgroups=1, k_chunks=2, stages=4, store_cols=2),
                   WgmmaConfig(bn=160, warpgroups=1, k_chunks=2, stages=4, overlap=1, store_cols=2),
                   WgmmaConfig(bn=160, warpgroups=1, k_chunks=2, stages=4, overlap=1, store_cols=4),
                   WgmmaConfig(bn=128, warpgroups=1, k_chunks=2, stages=4, overlap=1, store_cols=4),
                   WgmmaConfig(bn=128, warpgroups=1, k_chunks=2, stages=2, store_cols=4)))
# the same in TF32 (fp32 rows are 128 bytes: the ring fits fewer buffers); compile builds projection_wgmma.TF32
WGMMA_TF32 = named("tf32", (WgmmaConfig(bn=256, stages=3, overlap=1), WgmmaConfig(bn=256, stages=4, overlap=1), WgmmaConfig(bn=128, stages=6, overlap=1),
                        WgmmaConfig(bn=128, k_chunks=2, stages=3, overlap=1),
                        WgmmaConfig(bn=256, stages=4, overlap=1, store_cols=2), WgmmaConfig(bn=256, stages=4, overlap=1, store_cols=4),
                        WgmmaConfig(bn=128, stages=6, overlap=1, store_cols=2), WgmmaConfig(bn=128, stages=6, overlap=1, store_cols=4)))
# exact fp32 as 3xTF32 on wgmma (high and low parts split in shared memory, each chunk summed apart); compile builds TF32X3
# (overlap: one chunk's products run while the next chunk is split, two chunk sums by parity)
WGMMA_TF32X3 = named("tf32x3", (WgmmaConfig(bn=128, stages=2), WgmmaConfig(bn=128, stages=2, store_cols=2), WgmmaConfig(bn=128, stages=2, store_cols=4), WgmmaConfig(bn=128, stages=2, overlap=1), WgmmaConfig(bn=128, stages=3, overlap=1),
                          WgmmaConfig(bn=64, warpgroups=1, stages=2, overlap=1), WgmmaConfig(bn=128, warpgroups=1, stages=4, overlap=1),
                          # X split in registers (the rs form), W's low parts copied beside W (lo_w): no parts buffers, so
                          # more of the ring fits (48 KB a buffer at 128 x 128)
                          WgmmaConfig(bn=128, stages=2, store_cols=2, lo_w=1), WgmmaConfig(bn=128, stages=3, store_cols=2, lo_w=1),
                          WgmmaConfig(bn=128, stages=4, store_cols=2, lo_w=1), WgmmaConfig(bn=128, k_chunks=2, stages=2, store_cols=2, lo_w=1),
                          WgmmaConfig(bn=64, warpgroups=1, stages=4, store_cols=2, lo_w=1), WgmmaConfig(bn=64, k_chunks=2, stages=3, store_cols=2, lo_w=1),
                          # one warpgroup of 64 x 128: 80 KB of ring at two one-chunk buffers, so two blocks share an SM
                          # (each one's waits and barriers beside the other's wgmma's)
                          WgmmaConfig(bn=128, warpgroups=1, stages=2, store_cols=2, lo_w=1),
                          WgmmaConfig(bn=128, warpgroups=1, k_chunks=2, stages=2, store_cols=2, lo_w=1),
                          # compile's two points with 16 / 32 M tiles per raster group (W's low parts double W's bytes)
                          WgmmaConfig(bn=128, k_chunks=2, stages=2, store_cols=2, lo_w=1, group=16),
                          WgmmaConfig(bn=128, k_chunks=2, stages=2, store_cols=2, lo_w=1, group=32),
                          WgmmaConfig(bn=128, warpgroups=1, stages=2, store_cols=2, lo_w=1, group=16),
                          WgmmaConfig(bn=128, warpgroups=1, stages=2, store_cols=2, lo_w=1, group=32),
                          # where 128 columns do not divide the gates (ds2-gru's 2400): one warpgroup over 160 or 96
                          WgmmaConfig(bn=160, warpgroups=1, stages=2, store_cols=2, lo_w=1),
                          WgmmaConfig(bn=160, warpgroups=1, stages=3, store_cols=2, lo_w=1),
                          WgmmaConfig(bn=96, warpgroups=1, stages=2, store_cols=2, lo_w=1)))
# exact fp32 as three fp16 products of X's and W's scaled halves (f16x3): 128 x 128 with 1 or 2 chunks a buffer, 64 x
# 128 of one warpgroup (two blocks an SM at 96 KB of ring), and the 160- and 96-column points for a GRU's gates
WGMMA_F16X3 = named("f16x3", (WgmmaConfig(bn=128, k_chunks=2, stages=3, store_cols=2), WgmmaConfig(bn=128, k_chunks=2, stages=2, store_cols=2),
                              WgmmaConfig(bn=128, stages=4, store_cols=2), WgmmaConfig(bn=128, stages=6, store_cols=2),
                              WgmmaConfig(bn=128, warpgroups=1, k_chunks=2, stages=2, store_cols=2),
                              WgmmaConfig(bn=128, warpgroups=1, stages=4, store_cols=2), WgmmaConfig(bn=128, warpgroups=1, k_chunks=2, stages=3, store_cols=2),
                              WgmmaConfig(bn=128, k_chunks=2, stages=3, store_cols=4),
                              WgmmaConfig(bn=160, warpgroups=1, k_chunks=2, stages=4, store_cols=2), WgmmaConfig(bn=160, warpgroups=1, k_chunks=2, stages=2, store_cols=2),
                              WgmmaConfig(bn=96, warpgroups=1, k_chunks=2, stages=4, store_cols=2),
                              # 64 x 160 walking 2, 4, 12, 16 (compile's since bcccc08), 20, 24, 32 M tiles per raster group
                              # instead of 8, and 64 x 128 (where 160 columns do not divide the gates) 16 and 32
                              *(WgmmaConfig(bn=160, warpgroups=1, k_chunks=2, stages=2, store_cols=2, group=g) for g in (2, 4, 12, 16, 20, 24, 32)),
                              *(WgmmaConfig(bn=128, warpgroups=1, k_chunks=2, stages=2, store_cols=2, group=g) for g in (16, 32))))
