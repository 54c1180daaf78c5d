"""Checks of arguments users pass to the database API, shared so each check says the same thing everywhere."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from persist import InvalidUsage


def check_positive_int(value: object, what: str) -> int | None:
    """``value`` if it is a positive int (not a bool) or None; else InvalidUsage naming ``what``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidUsage(f"{what} must be a positive int or None, got {value!r}")
    return value


def check_not_async(fn: Callable[..., Any]) -> None:
    """InvalidUsage for an ``async def`` function (or callable object, or partial of one): ``run`` cannot await it."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    call = type(target).__call__ if not inspect.isroutine(target) else None  # (a callable object's method)
    if inspect.iscoroutinefunction(target) or (call is not None and inspect.iscoroutinefunction(call)):
        raise InvalidUsage(
            f"db.run takes a plain function of a transaction, got the async function {fn!r}, which it cannot "
            f"await; make it a plain `def` (nothing was committed)"
        )


def check_not_awaitable(fn: Callable[..., Any], result: object) -> None:
    """InvalidUsage if ``fn(t)`` returned an awaitable (closed unawaited, so it never runs)."""
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise InvalidUsage(
            f"db.run's function {fn!r} returned an awaitable ({type(result).__name__}), which run cannot "
            f"await: its work never ran; make it a plain `def` (nothing was committed)"
        )


__all__ = ["check_not_async", "check_not_awaitable", "check_positive_int"]
