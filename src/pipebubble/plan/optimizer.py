"""The optimizer step, priced: Adam after the last backward, memory-bound.

After its gradients are reduced, every rank updates the parameters it owns. Mixed-precision
Adam (fp32 master weights and two moments, Kingma & Ba 2015; ZeRO's ``o = 12`` bytes) does
almost no arithmetic per parameter and streams every byte of its state through HBM once:

- it reads the gradient (``g`` bytes) and reads and writes the master weight and both
  moments (``2 o``), and writes the 16-bit weight the next forward uses (``w``);
- gradient clipping (every large run here clips at norm 1.0) reads the gradients once more
  for their global norm (``g``).

So a parameter costs ``2 g + 2 o + w`` bytes (30 at ``w = g = 2, o = 12``), over the HBM
bandwidth (:func:`~pipebubble.plan.compute.memory_time`). Which parameters a rank updates
follows its sharding (:mod:`~pipebubble.plan.memory`): all of its local parameters with
``ddp``; its ``1 / N`` shard with ``zero1``, ``zero2`` and ``fsdp`` (``N = dp x cp``) and with
``hsdp`` its shard group's ``1 / S``. The step does not overlap the pipeline: a rank starts it
after its last backward and its exposed gradient traffic, and the step ends when the slowest
rank is done.

>>> round(step_time(2.75e9, "ddp", 1, (2.0, 2.0, 12.0), 2.039e12), 4)  # 22B / TP 8, A100
0.0405
>>> step_time(2.75e9, "zero1", 8, (2.0, 2.0, 12.0), 2.039e12) * 8 == step_time(
...     2.75e9, "ddp", 1, (2.0, 2.0, 12.0), 2.039e12)
True
"""

from __future__ import annotations

from .shardings import Sharding


def step_bytes(weight: float = 2.0, grad: float = 2.0, optimizer: float = 12.0) -> float:
    """HBM bytes one parameter's Adam step moves (module doc): ``2 g + 2 o + w``."""
    return 2 * grad + 2 * optimizer + weight


def updated_share(sharding: str, shard: int) -> float:
    """The fraction of a rank's local parameters its optimizer updates."""
    return Sharding.of(sharding).updated_share(shard)


def step_time(params: float, sharding: str, shard: int,
              state_bytes: tuple[float, float, float], hbm: float) -> float:
    """Seconds of the Adam step of a rank holding ``params`` local parameters, sharded
    ``sharding`` over ``shard`` ranks, on ``hbm`` bytes/s (0: not priced)."""
    if hbm <= 0 or params <= 0:
        return 0.0
    return params * updated_share(sharding, shard) * step_bytes(*state_bytes) / hbm
