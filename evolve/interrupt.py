"""Waiting on a blocking policy call in a way Ctrl-C can cut short."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any


async def until_interrupted(interrupted: asyncio.Event, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a daemon thread; None at once if `interrupted` fires first.

    A forward pass (a long prompt's prefill above all) cannot be cut between tokens, so Ctrl-C stops waiting
    for it instead; the policy's own stopping criterion ends the thread at its next token, and being a daemon
    it never holds up the process's exit.
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
    stopper = asyncio.ensure_future(interrupted.wait())
    try:
        await asyncio.wait({result, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    return result.result() if result.done() else None
