"""The V-Half / V-Min builder (``schedules/building_block.py``) is tuned for speed only: the
orders it produces must not change. The digests below were taken from the builder before
its speed-up (commit 266291d: ``reorder``/``reorder_ends`` with per-pass tuple dicts) on a
grid of ranks, microbatches, caps, warm-up targets and ``deep``/``fill`` variants (the ones
``schedules/auto/adaptive.py`` asks for); any change of order changes a digest. To check
one by hand: ``git show 266291d:src/pipebubble/schedules/building_block.py`` and rerun
:func:`family_digest` / :func:`reorder_digest` against it.
"""

from __future__ import annotations

import hashlib

import pytest

from pipebubble.schedules import building_block as bb
from pipebubble.schedules.auto.adaptive import warmup_targets
from pipebubble.schedules.v_half import v_half, v_half_offsets
from pipebubble.schedules.v_min import v_min, v_min_published

FAMILIES = {"v-half": v_half, "v-min": v_min, "v-min-published": v_min_published}

FAMILY_DIGESTS = {
    ('v-half', 2): 'f82d3acc97ad5af2',
    ('v-half', 3): '868f9fe77b3d8727',
    ('v-half', 4): '7abed97655ee3329',
    ('v-half', 5): 'b8dc338f20ccfb5a',
    ('v-half', 6): '6b8143cc9eaf8b8e',
    ('v-half', 7): '82847f2222cee038',
    ('v-half', 8): '9b3993714370a56a',
    ('v-half', 9): 'bfadbf29842da181',
    ('v-half', 10): 'fa9b9b0887b3fa64',
    ('v-min', 2): '735374faedf5f90a',
    ('v-min', 3): '23524814f9be034a',
    ('v-min', 4): '9489d893a6997840',
    ('v-min', 5): 'c6fe21b8830e6a86',
    ('v-min', 6): '3f1c6c9f2c5d7eed',
    ('v-min', 7): '0faa557943082fb0',
    ('v-min', 8): 'db9588d94cef51ae',
    ('v-min', 9): '9afdb896de5edc22',
    ('v-min', 10): '71a8c9b1ccf19226',
    ('v-min-published', 2): '4d406c9ba3e1631f',
    ('v-min-published', 3): '248888d49d87fc4b',
    ('v-min-published', 4): '9489d893a6997840',
    ('v-min-published', 5): 'c6d4153fd6457e5e',
    ('v-min-published', 6): '4c05bf83844b3cd7',
    ('v-min-published', 7): '0faa557943082fb0',
    ('v-min-published', 8): 'fcfb0a5f0eb9ed0e',
    ('v-min-published', 9): '1b994219149bb6d5',
    ('v-min-published', 10): '71a8c9b1ccf19226',
}

# (ranks, block offsets) -> digest of reorder_ends and six reorder variants, m in 1, 3, p, 2p+1
REORDER_DIGESTS = {
    (2, (1, 1, 1, 1, 1, 1, 5)): '76a035f0c8521db7',
    (2, (2, 1, 1, 2, 1, 2, 4)): 'f24d8a3b9d9ec9d8',
    (3, (1, 1, 1, 1, 1, 1, 3)): 'f575306773c3bb1d',
    (3, (1, 2, 2, 1, 2, 1, 1)): 'a257fdea5798dc27',
    (3, (2, 1, 1, 2, 1, 2, 1)): 'da2fdd3bd23cfdad',
    (4, (1, 1, 1, 1, 1, 1, 1)): 'c6651566941e6630',
    (4, (2, 1, 1, 2, 1, 2, 4)): '1cb4f2f96bd922cd',
    (5, (1, 1, 1, 1, 1, 1, 5)): 'bb4d53aa93c097e9',
    (5, (1, 2, 2, 1, 2, 1, 1)): '5b9bd2234a05187a',
    (5, (2, 1, 1, 2, 1, 2, 1)): '7377ac08f88d41a7',
    (6, (1, 1, 1, 1, 1, 1, 3)): '6286c7f5233e485d',
    (6, (2, 1, 1, 2, 1, 2, 4)): 'a50e7bab807b7e4c',
    (7, (1, 1, 1, 1, 1, 1, 1)): 'e541c1378550c15c',
    (7, (1, 2, 2, 1, 2, 1, 1)): '46651b1b1a712165',
    (7, (2, 1, 1, 2, 1, 2, 1)): '3fb2c0ea373574cf',
    (8, (1, 1, 1, 1, 1, 1, 5)): 'ef88672c7321764f',
    (8, (2, 1, 1, 2, 1, 2, 4)): '3661a05604323cb2',
}


def _h(orders) -> str:
    return hashlib.sha256("\n".join(" ".join(map(str, o)) for o in orders).encode()
                          ).hexdigest()[:16]


def family_digest(name: str, p: int) -> str:
    """Every microbatch count 1 .. 2p + 8 and 3p + 11 (past ``build_periodic``'s switch)."""
    acc = hashlib.sha256()
    for m in [*range(1, 2 * p + 9), 3 * p + 11]:
        acc.update(FAMILIES[name](p, m).to_text().encode())
    return acc.hexdigest()[:16]


def reorder_digest(p: int, offsets: tuple[int, ...]) -> str:
    times = bb.block(p, offsets)
    acc = hashlib.sha256()
    for m in (1, 3, p, 2 * p + 1):
        rows = bb.repeat(p, m, times)
        cap, cap_i = bb.peak(p, rows), bb.peak(p, rows, frees="I")
        moved = bb.reorder_ends(p, m, times, cap, cap_i)
        acc.update(_h(moved).encode())
        k = cap + 2
        tg = warmup_targets(p, m, k)
        for base, c, ci, fill, w, deep in (
                (moved, cap, cap_i, False, None, 0), (rows, cap, cap_i, True, None, 0),
                (moved, k, max(k, cap_i), True, tg, 0), (moved, k, max(k, cap_i), False, tg, 0),
                (moved, k, max(k, cap_i), True, tg, 1), (rows, cap, None, True, None, 0)):
            got = bb.reorder(p, m, base, c, ci, fill=fill, warmup=w, deep=deep)
            acc.update(b"none" if got is None else (str(got[0]) + _h(got[1])).encode())
    return acc.hexdigest()[:16]


@pytest.mark.parametrize("name, p", sorted(FAMILY_DIGESTS))
def test_family_orders_are_the_ones_before_the_speed_up(name, p):
    assert family_digest(name, p) == FAMILY_DIGESTS[name, p]


@pytest.mark.parametrize("p, offsets", sorted(REORDER_DIGESTS))
def test_reorder_variants_are_the_ones_before_the_speed_up(p, offsets):
    assert reorder_digest(p, offsets) == REORDER_DIGESTS[p, offsets]


def test_the_digests_see_a_changed_order():
    """The check can fail: swapping two passes of one rank changes the digest."""
    rows = bb.repeat(3, 4, bb.block(3, v_half_offsets(3)))
    swapped = [list(r) for r in rows]
    swapped[1][2], swapped[1][3] = swapped[1][3], swapped[1][2]
    assert _h(rows) != _h(swapped)


# adaptive's cool-down wave (schedules/auto/adaptive.wave_cooldown), moved onto the clock's
# unit time: the digests were taken from it before (commit b1f08ee: its own unit clock over
# per-pass tuple dicts) on the orders the adaptive stage gives it, and on others.
WAVE_DIGESTS = {
    (2, (1, 1, 1, 1, 1, 1, 5)): 'e9b780d067650448',
    (3, (1, 2, 2, 1, 2, 1, 1)): 'f03157ed108d5cd6',
    (4, (2, 1, 1, 2, 1, 2, 4)): 'b592285a7fc67511',
    (6, (1, 1, 1, 1, 1, 1, 3)): 'cd9653c145339ec2',
    (8, (2, 1, 1, 2, 4, 5, 1)): '56c30dcf9ec2cf0a',
}


def wave_digest(p: int, offsets: tuple[int, ...]) -> str:
    """The wave of the block repeated, its ends reordered, and its warm-up-filled reorders
    (holes filled or not, deep or not) for peaks of 0, 1 and 3 more, m in 1, 3, p, 2p + 6."""
    from pipebubble.schedules.auto.adaptive import wave_cooldown

    times = bb.block(p, offsets)
    acc = hashlib.sha256()
    for m in (1, 3, p, 2 * p + 6):
        rows = bb.repeat(p, m, times)
        cap, cap_i = bb.peak(p, rows), bb.peak(p, rows, frees="I")
        moved = bb.reorder_ends(p, m, times, cap, cap_i)
        inputs = [(rows, cap), (moved, cap)]
        for k in (cap, cap + 1, cap + 3):
            tg = warmup_targets(p, m, k)
            for fill, deep in ((True, 0), (False, 0), (True, 1)):
                got = bb.reorder(p, m, moved, k, max(k, cap_i), fill=fill, warmup=tg, deep=deep)
                if got is not None:
                    inputs.append((got[1], k))
        for orders, k in inputs:
            got = wave_cooldown(p, m, orders, k)
            acc.update(b"none" if got is None else _h(got).encode())
    return acc.hexdigest()[:16]


@pytest.mark.parametrize("p, offsets", sorted(WAVE_DIGESTS))
def test_cooldown_wave_orders_are_the_ones_before_the_clock(p, offsets):
    assert wave_digest(p, offsets) == WAVE_DIGESTS[p, offsets]


def test_cooldown_wave_of_a_stalled_order_is_none():
    from pipebubble.schedules.auto.adaptive import wave_cooldown

    rows = bb.repeat(2, 3, bb.block(2, v_half_offsets(2)))
    first_i = next(n for n, a in enumerate(rows[0]) if a.kind == "I")
    rows[0].insert(0, rows[0].pop(first_i))  # an I before its own F: nothing can run it
    assert wave_cooldown(2, 3, rows, 4) is None


def test_reorder_ends_without_cap_i_is_an_unreachable_cap_i():
    for p in (2, 4, 6):
        times = bb.block(p, v_half_offsets(p))
        for m in (1, p, 2 * p + 1):
            cap = bb.peak(p, bb.repeat(p, m, times))
            assert bb.reorder_ends(p, m, times, cap) == bb.reorder_ends(p, m, times, cap, 10 ** 6)
