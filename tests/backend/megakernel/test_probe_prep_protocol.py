"""A model check of `moe_probe prep`'s hand-off protocol (prep_moe in csrc/probes/moe_probe.cu).

The probe cannot run here (no GPU), and a deadlocked probe would hang a device call until its time
limit, so its protocol is checked as a model, the way the emulator checks the megakernel's
schedules: every block is a preparing warp and its streaming warps (which pass the named barriers
together, so one coroutine), run in random interleavings against shared claim and expert counters.
The model follows the kernel's preparing loop step for step; a change to one needs the other.

Named barrier (bar.arrive / bar.sync with the block's full thread count): a generation completes
when both parties arrived; `sync` waits for it; a party arriving twice in one generation is the
hardware's undefined case and an error here.
"""

from __future__ import annotations

import random

import pytest

UP_GROUPS, DOWN_GROUPS = 96, 128
FULL, EMPTY = 1, 3  # + slot, as in prep_moe


class _Barrier:
    def __init__(self) -> None:
        self.arrived: set[str] = set()
        self.gen = 0

    def arrive(self, who: str) -> int:
        assert who not in self.arrived, f"{who} arrived twice in one barrier generation"
        self.arrived.add(who)
        g = self.gen
        if len(self.arrived) == 2:
            self.arrived.clear()
            self.gen += 1
        return g


def simulate(blocks: int, upg: int, dng: int, seed: int, active: int = 6, early_downs: bool = False) -> None:
    """One MoE phase of `active` experts on `blocks` blocks; raises AssertionError on a deadlock, an
    item streamed twice or never, a down streamed before its expert, or a barrier misuse.
    early_downs: the unsafe first version (a down item published, i.e. its expert waited for, at
    its claim, while the block may hold an up item it streamed but has not signalled)."""
    rng = random.Random(seed)
    ups, dns = UP_GROUPS // upg, DOWN_GROUPS // dng
    n_up = active * ups
    n_all = n_up + active * dns
    head = [0]
    done = [0] * active
    streamed: list[int] = []
    signalled = [0] * n_up

    def is_down(it: int) -> bool:
        return n_up <= it < n_all

    def block():
        bars = {i: _Barrier() for i in (1, 2, 3, 4)}
        s_item: list[int | None] = [None, None]

        def sync(who: str, bid: int):
            g = bars[bid].arrive(who)
            while bars[bid].gen == g:
                yield

        def preparer():
            def claim():
                it = head[0]
                head[0] += 1
                yield
                return it

            def publish(slot: int, it: int):
                if is_down(it):
                    a = (it - n_up) // dns
                    while done[a] < UP_GROUPS:
                        yield
                s_item[slot] = it
                bars[FULL + slot].arrive("prep")
                yield

            def deferred(it: int) -> bool:  # published only after the item before it is signalled
                return is_down(it) and not early_downs

            cur = yield from claim()
            yield from publish(0, cur)
            nxt = (yield from claim()) if cur < n_all else n_all
            if not deferred(nxt) and cur < n_all:
                yield from publish(1, nxt)
            j = 0
            while True:
                slot = j & 1
                yield from sync("prep", EMPTY + slot)
                if cur >= n_all:
                    return
                if cur < n_up:
                    done[cur // ups] += upg
                    signalled[cur] += 1
                    yield
                if deferred(nxt):
                    yield from publish(slot ^ 1, nxt)
                after = (yield from claim()) if nxt < n_all else n_all
                if not deferred(after) and nxt < n_all:
                    yield from publish(slot, after)
                cur, nxt = nxt, after
                j += 1

        def streamers():
            j = 0
            while True:
                slot = j & 1
                yield from sync("stream", FULL + slot)
                it = s_item[slot]
                assert it is not None
                if it < n_all:
                    if is_down(it):
                        assert done[(it - n_up) // dns] == UP_GROUPS, "a down item streamed before its expert"
                    for _ in range(rng.randint(1, 5)):  # streaming takes a while
                        yield
                    streamed.append(it)
                bars[EMPTY + slot].arrive("stream")
                yield
                if it >= n_all:
                    return
                j += 1

        return [preparer(), streamers()]

    live = [p for _ in range(blocks) for p in block()]
    for _ in range(400_000):
        if not live:
            break
        p = rng.choice(live)
        try:
            next(p)
        except StopIteration:
            live.remove(p)
    assert not live, f"no progress: deadlock ({blocks} blocks, seed {seed})"
    assert sorted(streamed) == list(range(n_all)), "every item streamed exactly once"
    assert all(n == 1 for n in signalled), "every up item signalled exactly once"


@pytest.mark.parametrize("shape", [(48, 64), (32, 32)])
@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 13])
def test_prep_protocol_finishes_in_every_interleaving(blocks, shape):
    for seed in range(40):
        simulate(blocks, *shape, seed)


def test_the_model_catches_the_unsafe_order():
    """The first version published a down item (waited for its expert) at its claim; two blocks can
    then each wait for the expert whose last up item the other streamed but has not signalled."""
    with pytest.raises(AssertionError, match="deadlock"):
        for seed in range(200):
            for blocks in (2, 3, 5):
                simulate(blocks, 48, 64, seed, early_downs=True)
