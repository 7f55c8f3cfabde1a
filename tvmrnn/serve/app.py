"""The ASGI app: the v2 HTTP routes, /metrics, and start-up/shutdown of the batchers. Infer requests are handled as
raw ASGI (`_App`, the hot path); the other routes and the lifespan go through Starlette.

Routes (`/versions/1` forms too, the only version a model has):

    GET  /v2                              server metadata
    GET  /v2/health/live | /v2/health/ready
    GET  /v2/models/{name}                model metadata (v2 datatypes, -1 for dynamic dims)
    GET  /v2/models/{name}/ready
    GET  /v2/models/{name}/config         Triton's model configuration (model_config.proto as JSON)
    GET  /v2/models/{name}/stats          Triton's statistics extension (also /v2/models/stats: every model)
    POST /v2/models/{name}/infer          JSON or binary tensors; sequence_id/_start/_end parameters
    GET  /metrics                         Prometheus

Every error is a v2 error body `{"error": "..."}` with a 4xx (the request is at fault) or 5xx status.
Shutting down (lifespan end, after uvicorn has let in-flight requests finish) drains the batch queues,
then stops the model workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import zlib

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from .batcher import Batcher
from .config import ServeConfig
from .core import ModelCore
from .metrics import Metrics
from .protocol import HEADER_LENGTH, ProtocolError, encode_infer_response, error_body, parse_infer_request
from .repository import ServedModel
from .sequences import SequenceStore, sequence_params

log = logging.getLogger("tvmrnn.serve")
VERSION = "1"
_OFFLOAD_BYTES = 256 * 1024  # decode/encode bodies larger than this in a thread, not on the event loop


_HEADER_LENGTH_KEY = HEADER_LENGTH.lower().encode()


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status, media_type="application/json")


class Service:
    """The state behind the routes: models, their cores (batching and streaming state, here or in engine processes), metrics.

    `connect`, when given, is an async function returning {model name: core} (`engine.RemoteCore`s) and one closing them;
    without it each model gets a `ModelCore` in this process, its batcher running the model's runner."""

    def __init__(self, models: dict[str, ServedModel], config: ServeConfig, metrics: Metrics | None = None, connect=None):
        self.models, self.config = models, config
        self.metrics = metrics or Metrics()
        self.sequences = SequenceStore(config.max_sequences, config.sequence_idle_s, self.metrics)
        self.cores: dict = {}
        self._connect = connect
        self.ready = False

    def local_cores(self) -> dict[str, ModelCore]:
        cores = {}
        for name, m in self.models.items():
            b = Batcher(m.signature, m.runner, m.signature.batch_limit(self.config.max_batch_size),
                        self.config.max_delay_ms / 1000, self.metrics)
            b.start()
            cores[name] = ModelCore(name, m.signature, b, self.sequences)
        return cores

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        if self._connect is not None:
            self.cores, disconnect = await self._connect()
            sweeper = None
        else:
            self.cores = self.local_cores()
            sweeper = asyncio.get_running_loop().create_task(self.sequences.sweep_forever())
        self.ready = True
        log.info("ready", extra={"fields": {"models": list(self.models)}})
        try:
            yield
        finally:
            self.ready = False
            if sweeper is None:
                await disconnect()
            else:
                sweeper.cancel()
                for core in self.cores.values():
                    await core.batcher.close()
                for m in self.models.values():
                    await asyncio.to_thread(m.runner.close)
            log.info("stopped", extra={"fields": {"models": list(self.models)}})

    # -- lookups ----------------------------------------------------------------------------------
    def model(self, request: Request) -> ServedModel:
        return self.model_named(request.path_params["model"], request.path_params.get("version"))

    def model_named(self, name: str, version: str | None) -> ServedModel:
        if name not in self.models:
            raise ProtocolError(f"unknown model {name!r}; this server serves {sorted(self.models)}", 404)
        if version is not None and version != VERSION:
            raise ProtocolError(f"model {name!r} has no version {version!r}; its only version is {VERSION!r}", 404)
        return self.models[name]

    async def body(self, headers: dict[bytes, bytes], receive) -> bytes:
        """The request body within --max-request-bytes (413 past it), gzip/deflate undone."""
        limit = self.config.max_request_bytes
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            raise ProtocolError(f"the request body is {int(length)} bytes; the limit (--max-request-bytes) is {limit}", 413)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ProtocolError(f"the request body is over {limit} bytes, the limit (--max-request-bytes)", 413)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
        if encoding in ("gzip", "deflate"):
            inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header
            try:
                body = inflater.decompress(body, limit + 1)
            except zlib.error as err:
                raise ProtocolError(f"the body is not valid {encoding} data: {err}") from None
            if len(body) > limit or inflater.unconsumed_tail:
                raise ProtocolError(f"the decompressed request body is over {limit} bytes, the limit (--max-request-bytes)", 413)
        elif encoding not in ("identity", ""):
            raise ProtocolError(f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or identity", 415)
        return body

    # -- routes -----------------------------------------------------------------------------------
    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse({"name": "tvmrnn", "version": __version__, "extensions": ["binary_tensor_data", "parameters", "sequence"]})

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def server_ready(self, request: Request) -> Response:
        if not self.ready:
            return _error(503, "the server is starting or shutting down")
        return JSONResponse({"ready": True})

    async def model_metadata(self, request: Request) -> Response:
        try:
            return JSONResponse(self.model(request).signature.v2_metadata())
        except ProtocolError as err:
            return _error(err.status, str(err))

    async def model_ready(self, request: Request) -> Response:
        try:
            m = self.model(request)
        except ProtocolError as err:
            return _error(err.status, str(err))
        if not self.ready:
            return _error(503, f"model {m.name!r} is not ready: the server is starting or shutting down")
        return JSONResponse({"name": m.name, "ready": True})

    async def model_config(self, request: Request) -> Response:
        try:
            sig = self.model(request).signature
        except ProtocolError as err:
            return _error(err.status, str(err))
        c = self.config
        return JSONResponse(sig.triton_config(c.max_batch_size, c.max_delay_ms, c.sequence_idle_s))

    async def model_stats(self, request: Request) -> Response:
        try:
            names = [self.model(request).name] if "model" in request.path_params else sorted(self.models)
        except ProtocolError as err:
            return _error(err.status, str(err))
        stats = await asyncio.to_thread(lambda: [self.metrics.triton_stats(n, VERSION) for n in names])
        return JSONResponse({"model_stats": stats})

    async def metrics_route(self, request: Request) -> Response:
        body, content_type = self.metrics.exposition()
        return Response(body, 200, headers={"content-type": content_type})

    async def infer(self, name: str, version: str | None, scope, receive, send) -> None:
        """POST /v2/models/NAME[/versions/V]/infer, as a raw ASGI handler (see `_App`)."""
        start = time.perf_counter()
        if scope["method"] != "POST":
            await _send(send, 405, error_body(f"Method Not Allowed: {scope['method']} {scope['path']}"),
                        [_JSON, (b"allow", b"POST")])
            return
        label = name if name in self.models else ""
        fields = {"model": label or name[:80]}
        status, body, headers = await self._answer(name, version, dict(scope["headers"]), receive, fields)
        seconds = time.perf_counter() - start
        self.metrics.count_request(label, status, seconds)
        level = logging.INFO if status < 400 else logging.WARNING
        if log.isEnabledFor(level):
            fields.update(status=status, ms=round(seconds * 1000, 3))
            log.log(level, "infer", extra={"fields": fields})
        await _send(send, status, body, headers)

    async def _answer(self, name: str, version: str | None, headers: dict[bytes, bytes], receive, fields: dict):
        """(status, body, headers) of an infer request; `fields` (the log line's) get its id, sequence and error."""
        try:
            sig = self.model_named(name, version).signature
            body = await self.body(headers, receive)
            header_length = headers.get(_HEADER_LENGTH_KEY)
            args = (body, header_length and header_length.decode("latin-1"), (name, sig.input_names))
            req = parse_infer_request(*args) if len(body) <= _OFFLOAD_BYTES else await asyncio.to_thread(parse_infer_request, *args)
            fields["id"] = req.id
            sid, seq_start, seq_end = sequence_params(req.parameters)
            if req.outputs is not None:
                bad = [o.name for o in req.outputs if o.name not in sig.output_names]
                if bad:
                    raise ProtocolError(f"unknown output {bad[0]!r} requested; model {name!r} has outputs {sig.output_names}")
            outputs = await self.cores[name].infer(req.inputs, req.datatypes, sid, seq_start, seq_end)
            if sid is not None:
                fields["sequence_id"] = sid
            args = (name, VERSION, req.id, outputs, req.outputs, req.binary_data_output)
            if sum(a.nbytes for a in outputs.values()) <= _OFFLOAD_BYTES:
                body, extra = encode_infer_response(*args)
            else:
                body, extra = await asyncio.to_thread(encode_infer_response, *args)
            return 200, body, [(k.lower().encode(), v.encode("latin-1")) for k, v in extra.items()]
        except ProtocolError as err:
            fields["error"] = str(err)
            return err.status, error_body(str(err)), [_JSON]
        except ClientDisconnect:
            fields["error"] = "the client disconnected while sending the request"
            return 499, b"", []  # nobody is left to read it (nginx's code for this)
        except Exception as err:  # noqa: BLE001 - a 500 for this request, the server goes on
            log.exception("infer failed", extra={"fields": fields})
            fields["error"] = str(err)
            return 500, error_body(f"internal error: {type(err).__name__}: {err}"), [_JSON]


_JSON = (b"content-type", b"application/json")
_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")


async def _send(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class _App:
    """The service's ASGI app. Infer requests, the hot path, go straight to `Service.infer` (no router, middleware, Request
    or Response objects: a third of an HTTP worker's time per request went there); every other route, and the lifespan,
    through Starlette."""

    def __init__(self, service: Service, routes: Starlette):
        self.service, self.routes, self.state = service, routes, routes.state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            m = _INFER_PATH.fullmatch(scope["path"])
            if m is not None:
                await self.service.infer(m[1], m[2], scope, receive, send)
                return
        await self.routes(scope, receive, send)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc, extra={"fields": {"path": request.url.path}})
    return _error(500, f"internal error: {type(exc).__name__}")


def create_app(models: dict[str, ServedModel], config: ServeConfig, metrics: Metrics | None = None, connect=None) -> _App:
    """The app serving `models` (from `repository.load_models`); it owns their runners and stops them at shutdown.
    With `connect` (see Service), the models run in engine processes and `models` need no runners."""
    s = Service(models, config, metrics, connect)
    routes = [
        Route("/v2", s.server_metadata, methods=["GET"]),
        Route("/v2/health/live", s.live, methods=["GET"]),
        Route("/v2/health/ready", s.server_ready, methods=["GET"]),
        Route("/metrics", s.metrics_route, methods=["GET"]),
        Route("/v2/models/stats", s.model_stats, methods=["GET"]),
    ]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(prefix, s.model_metadata, methods=["GET"]),
            Route(prefix + "/ready", s.model_ready, methods=["GET"]),
            Route(prefix + "/config", s.model_config, methods=["GET"]),
            Route(prefix + "/stats", s.model_stats, methods=["GET"]),
        ]
    app = Starlette(routes=routes, lifespan=s.lifespan, exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.service = s
    return _App(s, app)
