"""The open inference protocol v2 (KServe / Triton) over HTTP: tensors in and out, JSON and binary.

Decodes an infer request body (a JSON object, optionally followed by the binary tensor data
extension's raw bytes, whose split point is the `Inference-Header-Content-Length` header) into
numpy arrays, and encodes outputs back the same way. Also the v2 error body `{"error": "..."}`.

Nothing here knows about models: the shapes and datatypes are checked against the model in
`signature.py`; this module only checks that a request is well-formed v2.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import orjson  # parses and writes JSON several times faster than json; writes numpy arrays itself

# v2 datatype <-> numpy dtype name. BYTES (length-prefixed strings) and BF16 have no numpy twin here.
V2_TO_NUMPY = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64",
}
NUMPY_TO_V2 = {v: k for k, v in V2_TO_NUMPY.items()}
_V2_OF_DTYPE = {np.dtype(k): v for k, v in NUMPY_TO_V2.items()}  # keyed by dtype: str(dtype) is slow in numpy 2
_NUMPY = {k: np.dtype(v) for k, v in V2_TO_NUMPY.items()}
_WIRE_DTYPE = {k: v.newbyteorder("<") for k, v in _NUMPY.items()}  # binary tensors are little-endian
HEADER_LENGTH = "Inference-Header-Content-Length"


class ProtocolError(ValueError):
    """A request the server refuses; `status` is the HTTP status of the v2 error response."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def v2_datatype(numpy_dtype) -> str:
    dtype = np.dtype(numpy_dtype)
    if dtype not in _V2_OF_DTYPE:
        raise ProtocolError(f"dtype {dtype} has no v2 datatype", 500)
    return _V2_OF_DTYPE[dtype]


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: follow the request's binary_data_output


@dataclass
class InferRequest:
    """A decoded infer request: `inputs` in request order, `outputs` None for "all of them"."""

    id: str | None
    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    parameters: dict = field(default_factory=dict)
    outputs: list[RequestedOutput] | None = None
    binary_data_output: bool = False


def _dict(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def _shape(value, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise ProtocolError(f"input {name!r}: 'shape' must be a list of integers, got {json.dumps(value)[:80]}")
    if any(d < 0 for d in value):
        raise ProtocolError(f"input {name!r}: 'shape' {value} has a negative dimension")
    return value


def _json_tensor(data, name: str, datatype: str, shape: list[int]) -> np.ndarray:
    """JSON `data` (flat or nested, row-major) as an array of `datatype`; strict about kinds and ranges."""
    dtype = _NUMPY[datatype]
    if not isinstance(data, list):
        data = [data]
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError) as err:  # ragged nesting
        raise ProtocolError(f"input {name!r}: 'data' is not a regular (row-major) array of numbers: {err}") from None
    if raw.size and raw.dtype.kind not in "biuf":
        raise ProtocolError(f"input {name!r}: 'data' holds {raw.dtype.kind == 'U' and 'strings' or 'non-numbers'}; "
                            f"datatype {datatype} needs numbers")
    expected = math.prod(shape)
    if raw.size != expected:
        raise ProtocolError(f"input {name!r}: 'data' has {raw.size} element(s); shape {shape} needs {expected}")
    if dtype.kind in "iu":
        if raw.size and raw.dtype.kind == "f":
            raise ProtocolError(f"input {name!r}: 'data' holds non-integers; datatype {datatype} needs integers")
        info = np.iinfo(dtype)
        if raw.size and (raw.min() < info.min or raw.max() > info.max):
            raise ProtocolError(f"input {name!r}: 'data' has values outside the range of {datatype} [{info.min}, {info.max}]")
    elif dtype.kind == "b" and raw.size and raw.dtype.kind != "b":
        raise ProtocolError(f"input {name!r}: datatype BOOL needs true/false in 'data'")
    return raw.astype(dtype).reshape(shape)


def _request_json(body: bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """The request's JSON object and the binary data after it (`header_length` says where the JSON ends, if given)."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise ProtocolError(f"header {HEADER_LENGTH} must be an integer, got {header_length[:40]!r}") from None
        if not 0 < n <= len(body):
            raise ProtocolError(f"header {HEADER_LENGTH} is {n}, but the body has {len(body)} byte(s)")
        head, binary = body[:n], memoryview(body)[n:]
    else:
        head, binary = body, memoryview(b"")
    if not head.strip():
        raise ProtocolError("the request body is empty; expected a v2 infer request JSON object with 'inputs'")
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as err:
        raise ProtocolError(f"the request body is not valid JSON: {err}") from None
    return _dict(doc, "the request"), binary


def _requested_outputs(doc: dict) -> list[RequestedOutput] | None:
    """The request's 'outputs' (which outputs, each in binary or JSON), or None where it names none."""
    if "outputs" not in doc:
        return None
    if not isinstance(doc["outputs"], list):
        raise ProtocolError("'outputs' must be a list of {name, parameters}")
    outputs = []
    for i, out in enumerate(doc["outputs"]):
        out = _dict(out, f"outputs[{i}]")
        if not isinstance(out.get("name"), str):
            raise ProtocolError(f"outputs[{i}] needs a 'name' (a string)")
        oparams = _dict(out.get("parameters", {}), f"output {out['name']!r} 'parameters'")
        if "classification" in oparams:
            raise ProtocolError(f"output {out['name']!r}: the classification extension is not supported")
        binary_flag = oparams.get("binary_data")
        if binary_flag is not None and not isinstance(binary_flag, bool):
            raise ProtocolError(f"output {out['name']!r}: binary_data must be true or false")
        outputs.append(RequestedOutput(out["name"], binary_flag))
    return outputs


def parse_infer_request(body: bytes, header_length: str | None, model=None) -> InferRequest:
    """Decode a v2 infer request body; `header_length` is the Inference-Header-Content-Length header or None. `model`
    (name, input names), where given, names an unknown input before its data is read."""
    doc, binary = _request_json(body, header_length)
    params = _dict(doc.get("parameters", {}), "'parameters'")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError(f"'id' must be a string, got {json.dumps(request_id)[:40]}")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ProtocolError("the request needs 'inputs': a non-empty list of tensors {name, shape, datatype, data}")
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    offset = 0
    for i, tensor in enumerate(inputs):
        tensor = _dict(tensor, f"inputs[{i}]")
        name = tensor.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"inputs[{i}] needs a 'name' (a string)")
        if name in arrays:
            raise ProtocolError(f"input {name!r} is given twice")
        if model is not None and name not in model[1]:
            raise ProtocolError(f"unknown input {name!r}; model {model[0]!r} has inputs {list(model[1])}")
        for key in ("shape", "datatype"):
            if key not in tensor:
                raise ProtocolError(f"input {name!r} has no {key!r}")
        shape = _shape(tensor["shape"], name)
        datatype = tensor["datatype"]
        if datatype not in V2_TO_NUMPY:
            raise ProtocolError(f"input {name!r}: datatype {str(datatype)[:20]!r} is not supported; one of {sorted(V2_TO_NUMPY)}")
        tparams = _dict(tensor.get("parameters", {}), f"input {name!r} 'parameters'")
        size = tparams.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ProtocolError(f"input {name!r}: binary_data_size must be a non-negative integer")
            if "data" in tensor:
                raise ProtocolError(f"input {name!r} has both 'data' and binary_data_size; give one")
            dtype = _WIRE_DTYPE[datatype]
            want = math.prod(shape) * dtype.itemsize
            if size != want:
                raise ProtocolError(f"input {name!r}: binary_data_size is {size}, but shape {shape} of {datatype} is {want} byte(s)")
            if offset + size > len(binary):
                raise ProtocolError(f"input {name!r}: the body has {len(binary) - offset} byte(s) of binary data left, "
                                    f"binary_data_size says {size}" + ("" if header_length else f" (no {HEADER_LENGTH} header was sent)"))
            # a copy of its own: aligned and writable, in this machine's byte order
            arrays[name] = np.frombuffer(binary, dtype, want // dtype.itemsize, offset).astype(_NUMPY[datatype]).reshape(shape)
            offset += size
        elif "data" in tensor:
            arrays[name] = _json_tensor(tensor["data"], name, datatype, shape)
        else:
            raise ProtocolError(f"input {name!r} has no 'data' (nor a binary_data_size parameter)")
        datatypes[name] = datatype
    if offset != len(binary):
        raise ProtocolError(f"the body has {len(binary) - offset} byte(s) of binary data after the last binary input")
    outputs = _requested_outputs(doc)
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise ProtocolError("parameter binary_data_output must be true or false")
    return InferRequest(request_id, arrays, datatypes, params, outputs, binary_default)


def encode_infer_response(model: str, version: str, request_id: str | None, outputs: dict[str, np.ndarray],
                          requested: list[RequestedOutput] | None, binary_default: bool) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers: JSON, or JSON + binary tensors when any output is binary."""
    wanted = requested if requested is not None else [RequestedOutput(n) for n in outputs]
    tensors, blobs = [], []
    for out in wanted:
        arr = outputs[out.name]
        entry = {"name": out.name, "datatype": v2_datatype(arr.dtype), "shape": list(arr.shape)}
        if out.binary if out.binary is not None else binary_default:
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            entry["parameters"] = {"binary_data_size": arr.nbytes}
            blobs.append(arr.data if arr.flags.c_contiguous else arr.tobytes())  # copied once, into the body
        else:
            entry["data"] = np.ascontiguousarray(arr).reshape(-1)  # written by orjson as a flat JSON list
        tensors.append(entry)
    doc = {"model_name": model, "model_version": version, "outputs": tensors}
    if request_id is not None:
        doc["id"] = request_id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return head, {"content-type": "application/json"}
    return b"".join([head, *blobs]), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
