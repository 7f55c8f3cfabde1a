"""Tensors between the service's processes without pickling: a frame is an 8-byte prefix (the JSON head's length and the
tensor bytes' length, little-endian uint32), the JSON head, then the tensors' raw bytes back to back in the order the
head lists them (`tensors`: [[name, numpy dtype string, shape], ...])."""

from __future__ import annotations

import asyncio
import json
import math
import struct

import numpy as np

_PREFIX = struct.Struct("<II")


def encode_frame(head: dict, tensors: dict[str, np.ndarray] | None = None) -> bytes:
    blobs = []
    if tensors:
        arrays = [np.ascontiguousarray(a) for a in tensors.values()]
        head["tensors"] = [[n, a.dtype.str, list(a.shape)] for n, a in zip(tensors, arrays)]
        blobs = [a.tobytes() for a in arrays]
    head_bytes = json.dumps(head).encode()
    data = b"".join(blobs)
    return b"".join([_PREFIX.pack(len(head_bytes), len(data)), head_bytes, data])


def decode_frame(frame: bytes) -> tuple[dict, bytes]:
    """(head, tensor bytes) of a whole frame."""
    head_len, _ = _PREFIX.unpack_from(frame)
    return json.loads(frame[_PREFIX.size:_PREFIX.size + head_len]), frame[_PREFIX.size + head_len:]


def decode_tensors(head: dict, data: bytes) -> dict[str, np.ndarray]:
    """The frame's tensors: read-only views of `data`."""
    out, offset = {}, 0
    for name, dtype, shape in head.get("tensors", ()):
        dtype, count = np.dtype(dtype), math.prod(shape)
        out[name] = np.frombuffer(data, dtype, count, offset).reshape(shape)
        offset += count * dtype.itemsize
    return out


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict, bytes] | None:
    """The next frame's (head, tensor bytes), or None at the end of the stream."""
    try:
        head_len, data_len = _PREFIX.unpack(await reader.readexactly(_PREFIX.size))
        body = await reader.readexactly(head_len + data_len)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return json.loads(body[:head_len]), body[head_len:]
