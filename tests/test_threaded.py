"""iterate_in_threads: async iteration over a blocking generator, every step in a worker thread, no step
abandoned by a cancelled consumer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from dp_icl_plugin._runtime.threaded import iterate_in_threads


class Steps:
    """A generator of slow steps that records where each ran and whether it was closed."""

    def __init__(self, n: int, delay: float, fail_at: int | None = None) -> None:
        self.n, self.delay, self.fail_at = n, delay, fail_at
        self.threads: list[str] = []
        self.finished = 0
        self.closed = False

    def __call__(self) -> Iterator[int]:
        try:
            for i in range(self.n):
                self.threads.append(threading.current_thread().name)
                time.sleep(self.delay)
                if i == self.fail_at:
                    raise KeyError(i)
                self.finished += 1
                yield i
        finally:
            self.closed = True


async def first_step_running(steps: Steps) -> None:
    """Wait until the first step has begun in its worker thread (however loaded the machine: no fixed sleep)."""
    for _ in range(10_000):
        if steps.threads:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the first step never began")


async def test_items_in_order_each_step_off_the_loop() -> None:
    steps = Steps(4, 0.0)
    assert [i async for i in iterate_in_threads(steps)] == [0, 1, 2, 3]
    assert threading.current_thread().name not in steps.threads and steps.closed


async def test_an_error_in_a_step_reaches_the_consumer_and_closes_the_generator() -> None:
    steps = Steps(4, 0.0, fail_at=2)
    with pytest.raises(KeyError):
        [i async for i in iterate_in_threads(steps)]
    assert steps.finished == 2 and steps.closed


@pytest.mark.parametrize("cancels", [1, 3])
async def test_a_cancelled_consumer_lets_the_step_in_flight_finish_then_closes(cancels: int) -> None:
    steps = Steps(5, 0.5)

    async def consume() -> None:
        async for _ in iterate_in_threads(steps):
            pass

    task = asyncio.create_task(consume())
    await first_step_running(steps)
    for _ in range(cancels):
        task.cancel()
        await asyncio.sleep(0.02)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps.finished == 1 and steps.closed  # the step ended, no further step began, the generator closed


def test_a_step_in_flight_when_the_loop_shuts_down_still_ends_before_the_close() -> None:
    """asyncio.run cancels every task at its end: the step is no task, so it is neither cancelled nor
    abandoned (closing the generator under a running thread raised ValueError)."""
    steps = Steps(5, 0.3)
    errors: list[BaseException] = []

    async def main() -> None:
        async def consume() -> None:
            try:
                async for _ in iterate_in_threads(steps):
                    pass
            except BaseException as exc:
                errors.append(exc)
                raise

        asyncio.get_running_loop().create_task(consume())
        await first_step_running(steps)  # main returns with the consumer mid-step

    asyncio.run(main())
    assert steps.finished == 1 and steps.closed
    assert [type(e) for e in errors] == [asyncio.CancelledError]


async def test_on_cancel_is_called_when_the_consumer_gives_up_mid_step() -> None:
    steps = Steps(5, 0.5)
    told: list[bool] = []

    async def consume() -> None:
        async for _ in iterate_in_threads(steps, on_cancel=lambda: told.append(True)):
            pass

    task = asyncio.create_task(consume())
    await first_step_running(steps)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert told == [True] and steps.finished == 1
