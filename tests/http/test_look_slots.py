"""The looks of waits and event streams take at most half of a face's pool at once (api/waits.py
LookSlots): a burst of them (1,000 MCP waits arming, 5,000 event streams woken by their mail:
docs/reliability.md, "Load held") leaves the other half to every other request's calls, which otherwise
queued behind theirs in the pool's one FIFO."""

from __future__ import annotations

import asyncio

from mailroom.api.waits import LookSlots


def test_looks_take_at_most_half_the_pool_and_all_are_answered() -> None:
    async def run() -> tuple[int, list[int]]:
        slots = LookSlots(8)
        release = asyncio.Event()
        most = 0

        async def look(n: int) -> int:
            nonlocal most
            most = max(most, slots.busy)
            await release.wait()
            return n

        looks = [asyncio.ensure_future(slots.run(lambda n=n: look(n))) for n in range(20)]
        while slots.busy < slots.size:
            await asyncio.sleep(0)
        for _ in range(10):  # the others stay queued however long the first ones hold
            await asyncio.sleep(0)
        held = slots.busy
        release.set()
        answers = await asyncio.gather(*looks)
        assert max(most, held) == 4
        return held, answers

    held, answers = asyncio.run(run())
    assert held == 4 and answers == list(range(20))


def test_a_pool_of_one_still_looks() -> None:
    async def run() -> int:
        slots = LookSlots(1)
        assert slots.size == 1

        async def look() -> int:
            return 7

        return await slots.run(look)

    assert asyncio.run(run()) == 7
