"""The error shape, the request id and the body-size limit (`server-contract.md` §2).

Every non-2xx native response is `{"error": {code, message, details?, request_id}}`; the OpenAI routes
answer in OpenAI's shape. Every response carries `X-Request-Id` (the client's, or a new `req_…`).
"""

from __future__ import annotations

import json
import logging
import re
from contextvars import ContextVar
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ringlet._ids import new_id
from ringlet.errors import RingletError

log = logging.getLogger("ringlet.server")
request_id: ContextVar[str] = ContextVar("request_id", default="")

_HTTP_CODES = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "payload_too_large", 415: "invalid_request",
               422: "validation_error", 429: "rate_limited", 500: "internal_error", 503: "unavailable"}
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error", 502: "upstream_error"}


class ApiError(RingletError):
    """An error response: raise it anywhere in a route."""

    def __init__(self, status: int, code: str, message: str, *, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.details, self.headers, self.param = details, headers, param


def parsed_json(raw: bytes | str, what: str = "the body") -> Any:
    """`raw` as JSON; 400 `invalid_request` naming what is wrong when it is not JSON, or is nested deeper than
    Python's parser goes (a 100,000-deep array is bad input, never a 500)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ApiError(400, "invalid_request", f"{what} is nested too deeply; send JSON nested at most a few "
                       "hundred levels") from None
    except ValueError as exc:
        raise ApiError(400, "invalid_request", f"{what} must be JSON: {exc}") from None


def error_body(status: int, code: str, message: str, details: dict[str, Any] | None = None,
               *, openai: bool = False, param: str | None = None) -> dict[str, Any]:
    if openai:
        kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}
    body: dict[str, Any] = {"code": code, "message": message, "request_id": request_id.get()}
    if details:
        body["details"] = details
    return {"error": body}


def _is_openai(request: Request) -> bool:
    return request.url.path.startswith("/v1/")


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the error shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.code, exc.message, exc.details, openai=_is_openai(request),
                                       param=exc.param), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": ".".join(str(p) for p in e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        first = errors[0] if errors else {"loc": "", "msg": "invalid request"}
        message = f"{first['loc']}: {first['msg']}" if first["loc"] else first["msg"]
        if _is_openai(request):
            return JSONResponse(error_body(400, "invalid_request", message, openai=True, param=first["loc"]), 400)
        return JSONResponse(error_body(422, "validation_error", message, {"errors": errors}), 422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "invalid_request")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405 and (allowed := allowed_methods(request)):
            headers["Allow"] = allowed  # Starlette's names only those of the first route on the path
        return JSONResponse(error_body(exc.status_code, code, str(exc.detail), openai=_is_openai(request)),
                            exc.status_code, headers=headers or None)


def allowed_methods(request: Request) -> str:
    """The `Allow` header of a 405: every method a route serves on the request's path (RFC 9110 §15.5.6),
    found by asking each route (the routers FastAPI nests included) whether it serves the path with it."""
    routes = [route for route in request.app.router.routes if not isinstance(route, Mount)]  # static files
    return ", ".join(method for method in _METHODS if any(
        route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes))


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def document(doc: dict[str, Any]) -> None:
    """Give every operation of the OpenAPI document `doc` the responses that the app's layers answer with
    besides the route itself, in the route's error shape (`ErrorBody`; `OpenAIError` under `/v1`): with a
    bearer key 401, 403 and 429; with a body 400 (not JSON) and 413; with parameters or a body 422 (400 under
    `/v1`, whose invalid requests are 400); 5XX everywhere. Every response carries `X-Request-Id`."""
    components = doc.setdefault("components", {})
    components.setdefault("headers", {})["X-Request-Id"] = {
        "description": "The client's `X-Request-Id`, or a new `req_…`.", "required": True,
        "schema": {"type": "string"}}
    for path, item in doc["paths"].items():
        openai = path.startswith("/v1/")
        shape = {"$ref": f"#/components/schemas/{'OpenAIError' if openai else 'ErrorBody'}"}
        for operation in item.values():
            responses: dict[str, Any] = operation["responses"]
            if openai or _fastapi_422(responses.get("422")):  # not what the handler answers (`install`)
                responses.pop("422", None)
            for status in _layer_statuses(operation, openai=openai):
                description, headers = _LAYER_RESPONSES[status]
                response = responses.setdefault(status, {
                    "description": description, "content": {"application/json": {"schema": shape}}})
                response["headers"] = {**headers, **response.get("headers", {})}
            for response in responses.values():
                response.setdefault("headers", {})["X-Request-Id"] = {"$ref": "#/components/headers/X-Request-Id"}
    for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 body, replaced above
        components.get("schemas", {}).pop(name, None)


def _fastapi_422(response: dict[str, Any] | None) -> bool:
    """Whether `response` is FastAPI's own 422 (`HTTPValidationError`)."""
    schema = ((response or {}).get("content") or {}).get("application/json", {}).get("schema", {})
    return schema.get("$ref", "").endswith("/HTTPValidationError")


def _layer_statuses(operation: dict[str, Any], *, openai: bool) -> list[str]:
    body = "requestBody" in operation
    statuses = ["401", "403", "429"] if operation.get("security") else []
    if body:
        statuses += ["400", "413"]
    if body or operation.get("parameters"):
        statuses.append("400" if openai else "422")
    return [*dict.fromkeys(statuses), "5XX"]


def _header(description: str) -> dict[str, Any]:
    return {"description": description, "required": True, "schema": {"type": "string"}}


_LAYER_RESPONSES: dict[str, tuple[str, dict[str, Any]]] = {
    "400": ("Invalid request: a body that is not JSON (under `/v1`, any invalid request)", {}),
    "401": ("Missing, unknown or expired API key (`unauthorized`)", {"WWW-Authenticate": _header("`Bearer`")}),
    "403": ("The key lacks the scope, realm or agent (`forbidden`, `realm_forbidden`)", {}),
    "413": ("The body is larger than `server.max_body_bytes` (`payload_too_large`)", {}),
    "422": ("Invalid body or parameters (`validation_error`, with `details.errors`)", {}),
    "429": ("Over the key's request rate, open streams or active runs (`rate_limited`)",
            {"Retry-After": _header("Seconds to wait before retrying")}),
    "5XX": ("A server error: `internal_error` (500), the model provider failing (502 `upstream_error`, under "
            "`/v1`), or `unavailable` (503, with `Retry-After`)", {})}
"""The responses `document` adds: (description, headers) by status."""


class RequestIdMiddleware:
    """Echo the client's `X-Request-Id` (or make one) on every response, and make it available to logs.
    It also turns an unhandled exception into the 500 error shape, so that response carries the id too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        rid = given[:200] if given and given.isprintable() else new_id("req")
        token = request_id.set(rid)

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s failed", rid)
            if started:  # the response is under way: all that is left is to drop the connection
                raise
            body = error_body(500, "internal_error", f"the server failed to handle this request; quote request "
                              f"id {rid} when reporting it", openai=scope["path"].startswith("/v1/"))
            await JSONResponse(body, 500)(scope, receive, send_with_id)
        finally:
            request_id.reset(token)


_NUL = re.compile(rb"(?:^|[^\\])(?:\\\\)*\\u0000")
"""A JSON string's NUL character (`\u0000` after an even number of backslashes, so not the text `\\u0000`)."""


class BodyLimitMiddleware:
    """Refuse bodies over `limit` bytes with 413 `payload_too_large`, by Content-Length or while reading; and
    a NUL character (in the path, the query or a JSON body) with 400 `invalid_request`: no text ringlet keeps
    has one, and PostgreSQL cannot store it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(scope, send, _TooLarge())
            return
        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            await self._refuse(scope, send, _Nul("the path or query"))
            return
        received, tail = 0, b""

        async def counted() -> Message:
            nonlocal received, tail
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                received += len(body)
                if received > self.limit:
                    raise _TooLarge()
                if b"u0000" in tail + body and _NUL.search(tail + body):
                    raise _Nul("the body")
                tail = body[-16:]
            return message

        try:
            await self.app(scope, counted, send)
        except (_TooLarge, _Nul) as refused:
            await self._refuse(scope, send, refused)

    async def _refuse(self, scope: Scope, send: Send, refused: HTTPException) -> None:
        openai = scope["path"].startswith("/v1/")
        if isinstance(refused, _TooLarge):
            body = error_body(413, "payload_too_large", f"the request body is larger than {self.limit} bytes "
                              "(server.max_body_bytes)", openai=openai)
        else:
            body = error_body(400, "invalid_request", refused.detail, openai=openai)
        await JSONResponse(body, refused.status_code)({"type": "http"}, _no_receive, send)


class _TooLarge(HTTPException):
    """Raised while a chunked body is read; FastAPI passes HTTPExceptions through its body parsing."""

    def __init__(self) -> None:
        super().__init__(413, "the request body is too large (server.max_body_bytes)")


class _Nul(HTTPException):
    def __init__(self, where: str) -> None:
        super().__init__(400, f"{where} holds a NUL character (\\u0000), which no text may hold; remove it")


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
