"""The input projection's GEMM (XW = X @ W^T + bias over all steps) for a layer: chosen here, emitted by tvmrnn.lowering.

On CUDA our GEMMs: on sm_90a above SMALL_M rows the warpgroup GEMM (projection_wgmma) where its tiles divide the gates
(256, 160, 128 or 96 columns), exact fp32 there as three fp16 products of X's and W's scaled halves (f16x3, at any row
count where the model does not fix them); otherwise with tensor cores the staged tensor-core GEMM (projection_staged),
both in the layer's mode (fp16/bf16, TF32 with precision="tf32", 3xTF32 for exact fp32); else projection_mma / the
exact-fp32 SIMT GEMM (projection_cuda) where it does not apply; TVM's matmul for shapes none covers. Our
register-blocked GEMM on CPUs.

On every target, where X is an embedding lookup (rows of a constant table) and the layer's W and B are constants, no
GEMM runs: the table's own projection E @ W^T + bias is a constant, computed at compile time, and XW gathers its rows
by the same indices (the "table" kind), as long as computing it stays small (TABLE_MAX_MACS).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules import projection_cuda, projection_mma, projection_staged, projection_wgmma
from schedules.projection_cpu import tile
from schedules.recurrent_cuda import xw_dtype as cuda_xw_dtype
from schedules.space import rounding_mode, tensor_cores

F32 = "float32"
# the most multiply-adds of an embedding table's projection (rows x In x D*G*H) computed at compile time: TVM's constant
# folding runs a plain loop nest (a quarter of a billion: seconds), and the table it keeps is as large as rows x cols
TABLE_MAX_MACS = 1 << 28


@dataclass(frozen=True)
class Projection:
    """Which GEMM computes a layer's XW, and how."""

    kind: str  # wgmma_f16x3 | wgmma | staged | mma | simt | matmul | cpu | table
    mode: str | None  # the tensor-core mode the GEMM runs in (projection_*.MODES), where it has one
    rows: int | None  # seq * batch where the model fixes both (a function of its own with tiles for them), else None
    in_size: int
    cols: int  # D * G * H: every direction's gates
    xw_dtype: str  # what the recurrent kernel reads XW in (the tensor-core GEMMs store it so; the rest are cast)
    label: str  # for the compile log and the module's metadata

    @property
    def suffix(self) -> str:
        """The part of a GEMM function's name that tells a fixed row count's tiles apart."""
        return "" if self.rows is None else f"_m{self.rows}"


def xw_dtype(spec, target) -> str:
    """The dtype the layer's recurrent kernel reads XW in: a CUDA half layer's own, fp32 on CPUs."""
    return cuda_xw_dtype(spec) if target.kind.name == "cuda" else F32


def _cuda_gemm(spec, target, rows, In: int, cols: int, xw: str) -> tuple[str, str | None, str]:
    """(kind, mode, label) of the CUDA GEMM, the first of the module docstring's order that applies."""
    mode = rounding_mode(spec, target)
    staged = mode or ("tf32x3" if tensor_cores(target) else None)
    arch = str((target.attrs or {}).get("arch", ""))
    large = rows is None or rows > projection_staged.SMALL_M
    if staged == "tf32x3" and large and projection_wgmma.supported("f16x3", In, cols, arch):
        point = projection_wgmma.default_config("f16x3", cols, In)
        return "wgmma_f16x3", "f16x3", f"wgmma f16x3 {point.block[0]}x{point.bn}, X and W as scaled fp16 halves"
    if large and projection_wgmma.supported(staged, In, cols, arch):
        point = projection_wgmma.default_config(staged, cols, In)
        low_parts = point.ring_blocks(staged)[1] == 2  # W with its TF32 low parts beside it (projection_wgmma.reads_low_parts)
        return "wgmma", staged, (f"wgmma {staged} {point.block[0]}x{point.bn}" + (", X split in registers" if low_parts else "")
                                 + (f" (staged mma.sync up to {projection_staged.SMALL_M} rows)" if rows is None else ""))
    if projection_staged.supported(staged, In, cols, rows=rows, xw_dtype=xw):
        return "staged", staged, f"staged mma.sync {staged}"
    if projection_mma.supported(mode, In, cols):
        return "mma", mode, f"mma.sync {mode}"
    if spec.dtype == F32 and projection_cuda.supported(In, cols):
        return "simt", None, "SIMT fp32"
    return "matmul", None, "TVM matmul"


def plan_projection(spec, target, rows: int | None, table_rows: int | None = None) -> Projection:
    """The GEMM of a layer (as compiled: its X in spec.dtype) on `target`; rows: seq * batch where the model fixes both;
    table_rows: the rows of the constant table X is looked up in, where it is one and W and B are constants."""
    In, cols, xw = spec.input_size, spec.num_directions * spec.gates * spec.hidden_size, xw_dtype(spec, target)
    if table_rows is not None and spec.dtype == xw == F32 and table_rows * In * cols <= TABLE_MAX_MACS:
        return Projection("table", None, rows, In, cols, xw,
                          f"none: rows of the {table_rows}-row embedding's projection, computed at compile time")
    if target.kind.name == "cuda":
        kind, mode, label = _cuda_gemm(spec, target, rows, In, cols, xw)
    else:
        mr, nr = tile(cols, str((target.attrs or {}).get("mcpu", "")), rows)
        kind, mode, label = "cpu", None, f"CPU register-blocked {mr}x{nr}"
    return Projection(kind, mode, rows, In, cols, xw, label + ("" if xw == F32 else f", XW in {xw}"))
