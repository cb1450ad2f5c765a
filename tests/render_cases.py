"""Hand-built schedules the renderers must draw before the real generators land: split
backward (I/W), interleaved chunks, V placement, DualPipe-style overlapped F&B steps."""

from __future__ import annotations

from pipebubble.ir.schedule import Action, Overlap, Schedule, make_schedule, validate


def projected(name: str, ranks: int, chunks: int, microbatches: int, split: bool,
              placement: str = "loop") -> Schedule:
    """Every rank runs its share of one global order (all F, then all I/B, then all W).

    A global topological order projected onto ranks can never deadlock."""
    S = ranks * chunks
    where = ([s % ranks for s in range(S)] if placement == "loop"
             else list(range(ranks)) + list(reversed(range(ranks))))
    order = [Action(s, "F", m) for m in range(microbatches) for s in range(S)]
    order += [Action(s, "I" if split else "B", m)
              for m in range(microbatches) for s in reversed(range(S))]
    if split:
        order += [Action(s, "W", m) for m in range(microbatches) for s in range(S)]
    orders = [[a for a in order if where[a.stage] == r] for r in range(ranks)]
    schedule = make_schedule(name, orders, S, microbatches, placement=placement)
    validate(schedule)
    return schedule


def overlapped_v() -> Schedule:
    """2 ranks, V placement (rank 0: stages 0 and 3; rank 1: stages 1 and 2), 3 microbatches,
    with two overlapped F&B steps on rank 0 and one on rank 1 (as DualPipeV pairs them)."""
    A = Action.from_str
    rank0 = [A("0F0"), A("0F1"), A("0F2"), A("3F0"), Overlap(A("3F1"), A("3B0")),
             Overlap(A("3F2"), A("3B1")), A("3B2"), A("0B0"), A("0B1"), A("0B2")]
    rank1 = [A("1F0"), A("1F1"), A("2F0"), A("1F2"), A("2F1"), A("2B0"),
             Overlap(A("2F2"), A("1B0")), A("2B1"), A("1B1"), A("2B2"), A("1B2")]
    schedule = make_schedule("overlap-v", [rank0, rank1], 4, 3, placement="v")
    validate(schedule)
    return schedule


def hand_built() -> dict[str, Schedule]:
    return {
        "split-iw": projected("split-iw", 3, 1, 4, split=True),
        "interleaved-v2": projected("interleaved-v2", 2, 2, 4, split=False),
        "v-placement-iw": projected("v-placement-iw", 2, 2, 3, split=True, placement="v"),
        "overlap-v": overlapped_v(),
    }
