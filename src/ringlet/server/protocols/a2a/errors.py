"""Failures as A2A answers them: ringlet's refusals as JSON-RPC errors (`a2a_error`), and unexpected
failures as the native API's 500 does, never with the exception's text (`hidden`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from a2a.utils.errors import A2AError, InternalError, InvalidParamsError, InvalidRequestError

from ringlet.errors import ConfigError
from ringlet.server.http.errors import ApiError, request_id

log = logging.getLogger("ringlet.server")
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])


def hidden(method: F) -> F:
    """A handler method whose unexpected failures answer as the native API's 500 does: logged with the
    request id, which the client is given to quote; never the exception's text (the SDK would send it, SQL
    and all, as the JSON-RPC error's message)."""

    @functools.wraps(method)
    async def hiding(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except (A2AError, asyncio.CancelledError):
            raise
        except Exception:
            rid = request_id.get()
            log.exception("A2A request %s failed", rid)
            raise InternalError(message=f"the server failed to handle this request; quote request id {rid} when "
                                "reporting it") from None

    return cast(F, hiding)


def a2a_error(exc: ApiError | ConfigError) -> A2AError:
    if isinstance(exc, ConfigError):
        return InvalidParamsError(message=str(exc))
    return InvalidRequestError(message=f"{exc.code}: {exc.message}") if exc.status != 422 else \
        InvalidParamsError(message=exc.message)
