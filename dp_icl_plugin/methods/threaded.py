"""Async iteration over a synchronous generator whose steps block (a DP answer: its charge, each token).

Adapters serve async callers (``astream``, ``agenerate``, LlamaIndex's ``astream_*``) from the synchronous
:class:`~dp_icl_plugin.methods.decoder.AnswerStream`. :func:`iterate_in_threads` runs every step in a worker
thread (the event loop stays free) and never lets a cancelled consumer abandon a step in flight: the step
(whose charge, once made, must still be reported) runs to its end before the generator is closed, however
often the consumer is cancelled meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import TypeVar

__all__ = ["iterate_in_threads"]

T = TypeVar("T")
_DONE = object()


async def iterate_in_threads(make: Callable[[], Iterator[T]]) -> AsyncGenerator[T, None]:
    """The items of ``make()``, each step run in a worker thread (``asyncio.to_thread``: in a copy of the
    caller's context as it is at that step), the generator made in a worker thread too. On cancellation or
    ``aclose`` the step in flight finishes first, then the generator is closed; the cancellation then goes on
    (also one that came while waiting)."""
    items: Iterator[T] | None = None
    step: asyncio.Future | None = None
    try:
        step = _in_thread(make)
        items = await asyncio.shield(step)
        while True:
            step = _in_thread(next, items, _DONE)
            item = await asyncio.shield(step)
            step = None
            if item is _DONE:
                return
            yield item
    finally:
        cancelled = False
        if step is not None:
            cancelled = await _finish(step)
            if items is None and not step.cancelled() and step.exception() is None:
                items = step.result()
        close = getattr(items, "close", None)
        if close is not None:
            close()
        if cancelled:
            raise asyncio.CancelledError


def _in_thread(func: Callable[..., object], *args: object) -> asyncio.Future:
    return asyncio.ensure_future(asyncio.to_thread(func, *args))


async def _finish(step: asyncio.Future) -> bool:
    """Wait for ``step`` to end, through any number of cancellations (a running thread cannot be
    interrupted); True when a cancellation came meanwhile."""
    cancelled = False
    while not step.done():
        try:
            await asyncio.wait({step})
        except asyncio.CancelledError:
            cancelled = True
    if not step.cancelled():
        step.exception()  # retrieved here: the consumer's own error or cancellation is what goes on
    return cancelled
