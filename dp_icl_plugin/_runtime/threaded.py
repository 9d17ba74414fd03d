"""Async iteration over a synchronous generator whose steps block (a DP answer: its charge, each token).

Adapters serve async callers (``astream``, ``agenerate``, LlamaIndex's ``astream_*``) from the synchronous
:class:`~dp_icl_plugin.decoding.contract.AnswerStream`. :func:`iterate_in_threads` runs every step in a worker
thread of its own (the event loop stays free, and steps that wait, such as answers queued for a fixed-latency
window, never tie up a pool that other work needs) and never abandons a step in flight: a step, whose charge
once made must still be reported, runs to its end before the generator is closed, however often the consumer
is cancelled meanwhile, also while the loop shuts down. A step's error reaches the consumer, never a log.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, TypeVar

__all__ = ["iterate_in_threads", "wait_through_cancellations"]

T = TypeVar("T")
_DONE = object()


async def iterate_in_threads(
    make: Callable[[], Iterator[T]], *, on_cancel: Callable[[], None] | None = None
) -> AsyncGenerator[T, None]:
    """The items of ``make()``, each step run in a worker thread (in a copy of the caller's context as it is
    at that step), the generator made in a worker thread too.

    On cancellation or ``aclose`` the step in flight finishes first (``on_cancel`` is called at once, from
    the loop, to tell it to give up if it can, e.g. :meth:`AnswerStream.cancel`), then the generator is
    closed; the cancellation then goes on (also one that came while waiting)."""
    items: Iterator[T] | None = None
    step: concurrent.futures.Future[Any] | None = None
    try:
        step = _submit(make)
        items = await _wait(step)
        while True:
            step = _submit(next, items, _DONE)
            item = await _wait(step)
            step = None
            if item is _DONE:
                return
            yield item
    except BaseException:
        if on_cancel is not None and step is not None and not step.done():
            on_cancel()
        raise
    finally:
        cancelled = False
        if step is not None:
            cancelled = await wait_through_cancellations(step)
            if items is None and not step.cancelled() and step.exception() is None:
                items = step.result()
        close = getattr(items, "close", None)
        if close is not None:
            close()
        if cancelled:
            raise asyncio.CancelledError


def _submit(func: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    """Run ``func(*args)`` in a new daemon thread, in a copy of the caller's context (a thread per step: a
    step that waits, such as an answer queued for its fixed-latency window, blocks no other work)."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    context = contextvars.copy_context()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(context.run(func, *args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="dp-icl-step", daemon=True).start()
    return future


def _retrieved(future: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """``future``, its exception marked retrieved once it ends (asyncio would log it, text and all, when a
    cancelled consumer no longer awaits it: a backend error could quote a private prompt)."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


async def _wait(step: concurrent.futures.Future[Any]) -> Any:
    # a fresh asyncio future over the thread's future each time: cancelling the wait never touches the step
    return await asyncio.shield(_retrieved(asyncio.wrap_future(step)))


async def wait_through_cancellations(future: concurrent.futures.Future[Any] | asyncio.Future[Any]) -> bool:
    """Wait for ``future`` to end, through any number of cancellations of the waiter (a running thread, or a
    delivery that must not be cut, is never interrupted); True when a cancellation came meanwhile (the caller
    re-raises it once its own cleanup is done). The future's error is marked retrieved, never logged."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait({_retrieved(asyncio.wrap_future(future))})
        except asyncio.CancelledError:
            cancelled = True
    if not future.cancelled():
        future.exception()  # retrieved here: the consumer's own error or cancellation is what goes on
    return cancelled
