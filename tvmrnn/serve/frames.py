"""Tensors between the service's processes without pickling: a frame is an 8-byte prefix (the JSON head's length and the
tensor bytes' length, little-endian uint32), the JSON head, then the tensors' raw bytes back to back in the order the
head lists them (`tensors`: [[name, numpy dtype string, shape], ...]).

On a stream (an HTTP worker's connection to an engine) frames travel back to back: `FrameReader` cuts whatever bytes
arrived into the whole frames among them, so one read can carry a batch's worth of requests or answers."""

from __future__ import annotations

import asyncio
import math
import struct

import numpy as np
import orjson

_PREFIX = struct.Struct("<II")


def encode_frame(head: dict, tensors: dict[str, np.ndarray] | None = None) -> bytes:
    blobs = []
    if tensors:
        arrays = [np.ascontiguousarray(a) for a in tensors.values()]
        head["tensors"] = [[n, a.dtype.str, a.shape] for n, a in zip(tensors, arrays)]
        blobs = [a.data for a in arrays]
    head_bytes = orjson.dumps(head)
    return b"".join([_PREFIX.pack(len(head_bytes), sum(b.nbytes for b in blobs)), head_bytes, *blobs])


def decode_frame(frame: bytes) -> tuple[dict, bytes]:
    """(head, tensor bytes) of a whole frame."""
    head_len, _ = _PREFIX.unpack_from(frame)
    return orjson.loads(frame[_PREFIX.size:_PREFIX.size + head_len]), frame[_PREFIX.size + head_len:]


def decode_tensors(head: dict, data: bytes) -> dict[str, np.ndarray]:
    """The frame's tensors: read-only views of `data`."""
    out, offset = {}, 0
    for name, dtype, shape in head.get("tensors", ()):
        dtype, count = np.dtype(dtype), math.prod(shape)
        out[name] = np.frombuffer(data, dtype, count, offset).reshape(shape)
        offset += count * dtype.itemsize
    return out


class FrameReader:
    """`feed(bytes)` -> the (head, tensor bytes) of every frame completed by them, in order; a partial frame is kept
    (and copied once, when it is whole) until the feeds that complete it."""

    def __init__(self):
        self._partial = bytearray()
        self._need = 0  # bytes the partial frame needs before anything can be cut from it

    def feed(self, data: bytes) -> list[tuple[dict, bytes]]:
        if self._partial:
            self._partial += data
            if len(self._partial) < self._need:
                return []
            data, self._partial = bytes(self._partial), bytearray()
        frames, pos, end = [], 0, len(data)
        while pos < end:
            if end - pos < _PREFIX.size:
                self._need = _PREFIX.size
                break
            head_len, data_len = _PREFIX.unpack_from(data, pos)
            start = pos + _PREFIX.size
            stop = start + head_len + data_len
            if stop > end:
                self._need = stop - pos
                break
            frames.append((orjson.loads(data[start:start + head_len]), data[start + head_len:stop]))
            pos = stop
        if pos < end:
            self._partial = bytearray(data[pos:])
        return frames


class FrameProtocol(asyncio.Protocol):
    """Frames over a stream connection (asyncio's protocol interface, no task per frame): `on_frame(head, tensor bytes)`
    is called for every frame received; `send(frame)` queues one, and every frame queued in one turn of the event loop
    leaves in one write at the end of it (a batch's answers, or the requests parsed from many HTTP connections at once)."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._out: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        for head, body in self._reader.feed(data):
            self.on_frame(head, body)

    def on_frame(self, head: dict, data: bytes) -> None:
        raise NotImplementedError

    def send(self, frame: bytes) -> None:
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(frame)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if not self.transport.is_closing():
            self.transport.write(b"".join(out))
