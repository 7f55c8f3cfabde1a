"""Silero VAD (PyPI silero-vad 6.2.3): the ONNX files the wheel ships, streamed 512-sample chunks at 16 kHz.

Each chunk is fed with the 64 samples before it (the package's OnnxWrapper does the same), and the LSTM state
returned for one chunk is the state input of the next.
"""

from __future__ import annotations

import shutil

import numpy as np

from .fetch import cached_onnx, package_dir

PACKAGE, VERSION = "silero-vad", "6.2.3"
CHUNK, CONTEXT, CHUNKS = 512, 64, 6
SEQUENCE_CHUNKS = 8  # silero_vad_16k_sequence on CUDA: at most this many chunks a call


def build(variant: str):
    """The shipped file silero_vad/data/<variant>.onnx, copied into the zoo's cache."""
    return cached_onnx(variant, lambda path: shutil.copyfile(
        package_dir(PACKAGE, VERSION) / "silero_vad" / "data" / f"{variant}.onnx", path))


def audio(rng, chunks: int = CHUNKS, rate: int = 16000) -> np.ndarray:
    """Speech-like test audio of chunks * CHUNK samples: a few harmonics under a syllable-rate envelope, plus noise."""
    t = np.arange(chunks * CHUNK) / rate
    f0 = 120 + 40 * rng.random()
    voiced = sum(np.sin(2 * np.pi * f0 * k * t + rng.random() * 6) / k for k in range(1, 6))
    envelope = np.clip(np.sin(2 * np.pi * 3 * t + rng.random() * 6), 0, None)
    return (0.3 * envelope * voiced + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


def windows(rng) -> list[np.ndarray]:
    """Each chunk with the CONTEXT samples before it (zeros before the first): [1, 576]."""
    x = np.concatenate([np.zeros(CONTEXT, np.float32), audio(rng)])
    return [x[i * CHUNK: i * CHUNK + CONTEXT + CHUNK][None] for i in range(CHUNKS)]


def state_feeds(rng):
    """Chunk feeds of the variants with one `state` input [2, 1, 128] (zeros at the start)."""
    state = np.zeros((2, 1, 128), np.float32)
    return [{"input": w, "state": state} for w in windows(rng)]


def sequence_feeds(rng):
    """silero_vad_16k_sequence: the chunks as two sequences [3, 576], its LSTM state (h, c) carried across them."""
    chunks, zeros = windows(rng), np.zeros((1, 1, 128), np.float32)
    half = len(chunks) // 2
    return [{"input": np.concatenate(part), "h": zeros, "c": zeros} for part in (chunks[:half], chunks[half:])]
