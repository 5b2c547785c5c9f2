"""One body, two conventions (clickhouse_lb.pools._steps): the same generator carried out by
calling each step or by awaiting it gives the same result, and a step's exception reaches the
body where it yielded, so its try/except/finally behave as around the call or the await."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from clickhouse_lb.pools._steps import Steps, close_quietly, drive, drive_async


def _body(first: Any, second: Any, log: list[str]) -> Steps[Any]:
    try:
        a = yield first
        try:
            b = yield second
        except KeyError as exc:  # a failed step, handled where it was taken
            log.append(f"handled {exc.args[0]}")
            b = "fallback"
        return (a, b)
    finally:
        log.append("released")


def _fail() -> Any:
    raise KeyError("missing")


async def _answer(value: Any) -> Any:
    await asyncio.sleep(0)
    return value


def test_called_and_awaited_give_the_same_result() -> None:
    log: list[str] = []
    assert drive(_body(lambda: 1, lambda: 2, log)) == (1, 2)
    assert asyncio.run(drive_async(_body(lambda: _answer(1), lambda: _answer(2), log))) == (1, 2)
    assert log == ["released", "released"]


def test_a_failed_step_is_raised_into_the_body_in_both() -> None:
    log: list[str] = []
    assert drive(_body(lambda: 1, _fail, log)) == (1, "fallback")

    async def fail() -> Any:
        await asyncio.sleep(0)
        raise KeyError("missing")

    assert asyncio.run(drive_async(_body(lambda: _answer(1), fail, log))) == (1, "fallback")
    assert log == ["handled missing", "released"] * 2


def test_an_unhandled_failure_runs_the_finally_and_propagates() -> None:
    log: list[str] = []

    def fail_hard() -> Any:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        drive(_body(fail_hard, lambda: 2, log))
    assert log == ["released"]


def test_cancellation_reaches_the_body_and_is_not_swallowed() -> None:
    log: list[str] = []

    async def main() -> None:
        reached, never = asyncio.Event(), asyncio.Event()

        async def wait_forever() -> None:
            reached.set()
            await never.wait()

        task = asyncio.create_task(drive_async(_body(lambda: _answer(1), wait_forever, log)))
        await reached.wait()  # the body is at its second step
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert log == ["released"]


def test_the_sync_driver_refuses_a_step_that_needs_awaiting() -> None:
    def body() -> Steps[Any]:
        return (yield lambda: _answer(1))

    with pytest.raises(RuntimeError, match="awaitable"):
        drive(body())


class _Client:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.closed = False

    def close(self) -> None:
        self.closed = True
        if self.error is not None:
            raise self.error


def test_closing_quietly_logs_a_failure_and_raises_nothing() -> None:
    client = _Client(OSError("reset"))
    drive(close_quietly(client))  # no exception
    assert client.closed
    with pytest.raises(KeyboardInterrupt):  # only failures are quiet
        drive(close_quietly(_Client(KeyboardInterrupt())))
