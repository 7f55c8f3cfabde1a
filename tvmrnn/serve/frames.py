"""Tensors between the service's processes without pickling: a frame is an 8-byte prefix (the head's length and the
tensor bytes' length, little-endian uint32), the head, then the tensors' raw bytes back to back in the order the head
lists them.

Two kinds of head:
- JSON (`encode_frame`, `decode_frame`): a model worker's batches (one frame per batch); the head lists its tensors as
  `tensors`: [[name, numpy dtype string, shape], ...].
- binary (`encode_request`, `encode_answers`, `encode_error`): the hop between an HTTP worker and a model's engine, one
  frame per request and one per batch's answers to one HTTP worker. The head is a kind byte, fixed fields packed with
  `struct`, then the tensor spec (count, then per tensor its name, numpy dtype string and shape), which repeats from
  request to request and is encoded and parsed once per distinct spec.

On a stream (an HTTP worker's connection to an engine) frames travel back to back: `FrameReader` cuts whatever bytes
arrived into the whole frames among them, so one read can carry a batch's worth of requests or answers."""

from __future__ import annotations

import asyncio
import math
import struct

import numpy as np
import orjson

_PREFIX = struct.Struct("<II")
_REQUEST = struct.Struct("<BQB")  # kind, id, flags (then the sequence id if any, then the spec)
_SID_LENGTH = struct.Struct("<H")
_ANSWERS = struct.Struct("<BI")  # kind, n (then n ids, n row counts, n lengths, then the spec)
_ERROR = struct.Struct("<BQH")  # kind, id, HTTP status (then the message)
REQUEST, ANSWERS, ERROR = 1, 2, 3
SEQUENCE, START, END, CHECKED = 1, 2, 4, 8  # request flags
_MAX_SPECS = 1024  # distinct tensor specs cached per process; past it the cache starts over


def encode_frame(head: dict, tensors: dict[str, np.ndarray] | None = None) -> bytes:
    blobs = []
    if tensors:
        arrays = [np.ascontiguousarray(a) for a in tensors.values()]
        head["tensors"] = [[n, a.dtype.str, a.shape] for n, a in zip(tensors, arrays)]
        blobs = [a.data for a in arrays]
    head_bytes = orjson.dumps(head)
    return b"".join([_PREFIX.pack(len(head_bytes), sum(b.nbytes for b in blobs)), head_bytes, *blobs])


def decode_frame(frame: bytes) -> tuple[dict, bytes]:
    """(JSON head, tensor bytes) of a whole frame."""
    head_len, _ = _PREFIX.unpack_from(frame)
    return orjson.loads(frame[_PREFIX.size:_PREFIX.size + head_len]), frame[_PREFIX.size + head_len:]


def decode_tensors(head: dict, data) -> dict[str, np.ndarray]:
    """A JSON-head frame's tensors: read-only views of `data`."""
    return _views([(name, np.dtype(dtype), tuple(shape)) for name, dtype, shape in head.get("tensors", ())], data)


def _views(spec, data) -> dict[str, np.ndarray]:
    out, offset = {}, 0
    for name, dtype, shape in spec:
        count = math.prod(shape)
        out[name] = np.frombuffer(data, dtype, count, offset).reshape(shape)
        offset += count * dtype.itemsize
    return out


# -- binary heads: the engine hop ----------------------------------------------------------------------
_spec_bytes: dict[tuple, bytes] = {}
_spec_parsed: dict[bytes, list] = {}


def _encode_spec(tensors: dict[str, np.ndarray]) -> bytes:
    key = tuple((n, a.dtype.str, a.shape) for n, a in tensors.items())
    spec = _spec_bytes.get(key)
    if spec is None:
        if len(_spec_bytes) >= _MAX_SPECS:
            _spec_bytes.clear()
        parts = [bytes([len(key)])]
        for name, dtype, shape in key:
            name_bytes = name.encode()
            parts += [struct.pack("<H", len(name_bytes)), name_bytes, bytes([len(dtype)]), dtype.encode(),
                      struct.pack(f"<B{len(shape)}Q", len(shape), *shape)]
        spec = _spec_bytes[key] = b"".join(parts)
    return spec


def _decode_spec(spec: bytes) -> list[tuple[str, np.dtype, tuple]]:
    parsed = _spec_parsed.get(spec)
    if parsed is None:
        if len(_spec_parsed) >= _MAX_SPECS:
            _spec_parsed.clear()
        parsed, pos = [], 1
        for _ in range(spec[0]):
            (n,) = struct.unpack_from("<H", spec, pos)
            name = spec[pos + 2:pos + 2 + n].decode()
            pos += 2 + n
            dtype = np.dtype(spec[pos + 1:pos + 1 + spec[pos]].decode())
            pos += 1 + spec[pos]
            ndim = spec[pos]
            shape = struct.unpack_from(f"<{ndim}Q", spec, pos + 1)
            pos += 1 + 8 * ndim
            parsed.append((name, dtype, shape))
        _spec_parsed[spec] = parsed
    return parsed


def _frame(head: bytes, arrays) -> bytes:
    blobs = [a.data if a.flags.c_contiguous else a.tobytes() for a in arrays]
    return b"".join([_PREFIX.pack(len(head), sum(b.nbytes if isinstance(b, memoryview) else len(b) for b in blobs)), head, *blobs])


def encode_request(request_id: int, feeds: dict[str, np.ndarray], sid=None, start: bool = False, end: bool = False,
                   checked: bool = False) -> bytes:
    """A request to an engine: its id, sequence parameters, whether its HTTP worker checked it, and its tensors."""
    flags = (SEQUENCE if sid is not None else 0) | (START if start else 0) | (END if end else 0) | (CHECKED if checked else 0)
    head = _REQUEST.pack(REQUEST, request_id, flags)
    if sid is not None:
        sid_bytes = orjson.dumps(sid)  # a string or an integer, as the client sent it
        head += _SID_LENGTH.pack(len(sid_bytes)) + sid_bytes
    return _frame(head + _encode_spec(feeds), feeds.values())


def decode_request(head, data) -> tuple[int, object, bool, bool, bool, dict[str, np.ndarray]]:
    """(id, sequence id or None, start, end, checked, tensors as read-only views of `data`)."""
    _, request_id, flags = _REQUEST.unpack_from(head)
    pos, sid = _REQUEST.size, None
    if flags & SEQUENCE:
        (n,) = _SID_LENGTH.unpack_from(head, pos)
        sid = orjson.loads(head[pos + 2:pos + 2 + n])
        pos += 2 + n
    feeds = _views(_decode_spec(bytes(head[pos:])), data)
    return request_id, sid, bool(flags & START), bool(flags & END), bool(flags & CHECKED), feeds


def request_id_of(head) -> int:
    """The id of a request whose head is otherwise unreadable (to answer it with an error)."""
    return _REQUEST.unpack_from(head)[1]


def encode_answers(ids: list[int], rows: list[int], lengths: list[int], outputs: dict[str, np.ndarray]) -> bytes:
    """The outputs of `ids`, whose rows lie back to back along each output's batch axis (`rows` each; `lengths`: each
    one's own length along the padded axis, -1 where not padded). One request's outputs are its own whole arrays."""
    n = len(ids)
    head = b"".join([_ANSWERS.pack(ANSWERS, n), struct.pack(f"<{n}Q{n}I{n}i", *ids, *rows, *lengths), _encode_spec(outputs)])
    return _frame(head, outputs.values())


def decode_answers(head, data) -> tuple[list[int], list[int], list[int], dict[str, np.ndarray]]:
    """(ids, rows, lengths, outputs as read-only views of `data`) of an answers frame."""
    _, n = _ANSWERS.unpack_from(head)
    fields = struct.unpack_from(f"<{n}Q{n}I{n}i", head, _ANSWERS.size)
    spec_at = _ANSWERS.size + 16 * n
    return list(fields[:n]), list(fields[n:2 * n]), list(fields[2 * n:]), _views(_decode_spec(bytes(head[spec_at:])), data)


def encode_error(request_id: int, status: int, message: str) -> bytes:
    head = _ERROR.pack(ERROR, request_id, status) + message.encode()
    return _PREFIX.pack(len(head), 0) + head


def decode_error(head) -> tuple[int, int, str]:
    """(id, HTTP status, message)."""
    _, request_id, status = _ERROR.unpack_from(head)
    return request_id, status, bytes(head[_ERROR.size:]).decode()


class FrameReader:
    """`feed(bytes)` -> the (head, tensor bytes) of every frame completed by them, in order, both memoryviews of what was
    read; a partial frame is kept (and copied once, when it is whole) until the feeds that complete it."""

    def __init__(self):
        self._partial = bytearray()
        self._need = 0  # bytes the partial frame needs before anything can be cut from it

    def feed(self, data: bytes) -> list[tuple[memoryview, memoryview]]:
        if self._partial:
            self._partial += data
            if len(self._partial) < self._need:
                return []
            data, self._partial = bytes(self._partial), bytearray()
        frames, pos, end, view = [], 0, len(data), memoryview(data)
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
            frames.append((view[start:start + head_len], view[start + head_len:stop]))
            pos = stop
        if pos < end:
            self._partial = bytearray(data[pos:])
        return frames


class FrameProtocol(asyncio.Protocol):
    """Frames over a stream connection (asyncio's protocol interface, no task per frame): `on_frame(head, tensor bytes)`
    is called for every frame received; `send(frame)` queues one, and every frame queued in one turn of the event loop
    leaves in one write at the end of it (a batch's answers, or the requests parsed from many HTTP connections at once).
    `wake()` asks for that write without a frame yet: `encode_pending` (called first) adds the frames it holds back."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._out: list[bytes] = []
        self._awake = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        for head, body in self._reader.feed(data):
            self.on_frame(head, body)

    def on_frame(self, head: memoryview, data: memoryview) -> None:
        raise NotImplementedError

    def send(self, frame: bytes) -> None:
        self.wake()
        self._out.append(frame)

    def wake(self) -> None:
        if not self._awake:
            self._awake = True
            self.loop.call_soon(self._flush)

    def encode_pending(self) -> None:
        pass

    def _flush(self) -> None:
        self._awake = False
        self.encode_pending()
        out, self._out = self._out, []
        if out and not self.transport.is_closing():
            self.transport.write(b"".join(out))
