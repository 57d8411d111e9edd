"""``swapless.tasks.gateway.turns`` alone: a caller's turns, first come first served, given back once, and a lane per
caller that goes when its last request ends (the gateway-level behaviour is in tests/test_gateway_security.py)."""

from __future__ import annotations

import asyncio

import pytest

from swapless.tasks.gateway.turns import NoTurn, Turns, give_back


def test_turns_go_first_come_first_served_and_other_callers_do_not_wait() -> None:
    async def scenario() -> list[str]:
        turns = Turns(1, 5.0)
        order: list[str] = []
        hold = asyncio.Event()

        async def request(owner: str, name: str) -> None:
            async with turns.turn(owner):
                order.append(name)
                if name == "a1":
                    await hold.wait()

        first = asyncio.create_task(request("a", "a1"))
        await asyncio.sleep(0)
        queued = [asyncio.create_task(request("a", f"a{i}")) for i in (2, 3)]
        await asyncio.sleep(0)
        await request("b", "b1")  # another caller: served while a1 holds a's only turn
        assert turns.active("a") == 1
        hold.set()
        await asyncio.gather(first, *queued)
        assert turns.active("a") == 0 and not turns._lanes  # the lanes are gone
        return order

    assert asyncio.run(scenario()) == ["a1", "b1", "a2", "a3"]


def test_a_turn_given_back_lets_the_next_request_in_and_is_given_back_once() -> None:
    async def scenario() -> None:
        turns = Turns(1, 0.2)
        inside = asyncio.Event()
        done = asyncio.Event()

        async def waiting_for_results() -> None:
            async with turns.turn("a"):
                give_back()
                give_back()  # a second time: nothing
                inside.set()
                await done.wait()

        task = asyncio.create_task(waiting_for_results())
        await inside.wait()
        async with turns.turn("a"):  # the turn is free while the first waits for its results
            assert turns.active("a") == 1
        done.set()
        await task
        assert turns.active("a") == 0

    asyncio.run(scenario())


def test_no_turn_in_time_is_refused_naming_the_setting() -> None:
    async def scenario() -> None:
        turns = Turns(1, 0.1)
        async with turns.turn("a"):
            with pytest.raises(NoTurn) as caught:
                async with turns.turn("a"):
                    pass
        assert caught.value.which == "SWAPLESS_GATEWAY_ACTIVE_PER_KEY" and caught.value.retry_after_s == 1
        assert turns.active("a") == 0

    asyncio.run(scenario())
