"""Waiting on a policy call in a way Ctrl-C can cut short (the loop's `interrupted` event)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def until_interrupted(interrupted: asyncio.Event, fn: Callable[..., T], *args: Any) -> T | None:
    """`fn(*args)` in a daemon thread; None at once if `interrupted` fires first.

    A forward pass (a long prompt's prefill above all) cannot be cut between tokens, so Ctrl-C stops waiting
    for it instead; the policy's own stopping criterion ends the thread at its next token, and being a daemon
    (not an executor thread, which `asyncio.run` would wait for) it never holds up the process's exit.
    """
    loop = asyncio.get_running_loop()
    result: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not result.done():
            result.set_exception(error) if error is not None else result.set_result(value)

    def work() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine, raised there
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, daemon=True, name="policy-generate").start()
    return await _first(interrupted, result)


async def cancel_on(interrupted: asyncio.Event, call: Awaitable[T]) -> T | None:
    """Await `call` (an HTTP policy's request); None at once if `interrupted` fires first, the call cancelled."""
    return await _first(interrupted, asyncio.ensure_future(call), cancel=True)


async def _first(interrupted: asyncio.Event, work: asyncio.Future[Any], cancel: bool = False) -> Any:
    stopper = asyncio.ensure_future(interrupted.wait())
    try:
        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if cancel and not work.done():
            work.cancel()
    return work.result() if work.done() else None
