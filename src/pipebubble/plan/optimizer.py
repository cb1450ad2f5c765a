"""The optimizer step, priced: Adam after the last backward, memory-bound.

After its gradients are reduced, every rank updates the parameters it owns. Mixed-precision
Adam (fp32 master weights and two moments, Kingma & Ba 2015; ZeRO's ``o = 12`` bytes) does
almost no arithmetic per parameter and streams every byte of its state through HBM once:

- it reads the gradient (``g`` bytes) and reads and writes the master weight and both
  moments (``2 o``), and writes the 16-bit weight the next forward uses (``w``);
- gradient clipping (every large run here clips at norm 1.0) reads the gradients once more
  for their global norm (``g``).

So a parameter costs ``2 g + 2 o + w`` bytes (30 at ``w = g = 2, o = 12``), over the HBM
bandwidth (:func:`~pipebubble.plan.compute.memory_time`). That is a fused step (one kernel
reads the gradient and the state and writes the state and the 16-bit weight: apex's and
torch's fused Adam with master weights). A framework whose step runs as separate passes moves
more, given as ``Hardware.optimizer_bytes`` (0: the fused count). Megatron-LM's
mixed-precision optimizer (``megatron/optimizer/optimizer.py``, ``MixedPrecisionOptimizer.step``
and the DDP's gradient buffer) with bf16 and fp32 main gradients: zeroing the fp32 gradient
buffer before the step's backward (write 4), the clipping norm (read 4), Adam on the fp32
main parameters (read gradient, parameter and both moments, write the three: 28), and
``_copy_main_params_to_model_params`` (read 4, write 2): 42 bytes; fp16 adds the loss
scaler's unscale-and-check pass (read and write 4: 50). Which parameters a rank updates
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


def step_bytes(weight: float = 2.0, grad: float = 2.0, optimizer: float = 12.0) -> float:
    """HBM bytes one parameter's Adam step moves (module doc): ``2 g + 2 o + w``."""
    return 2 * grad + 2 * optimizer + weight


def updated_share(sharding: str, shard: int) -> float:
    """The fraction of a rank's local parameters its optimizer updates."""
    return 1.0 if sharding == "ddp" else 1.0 / max(shard, 1)


def step_time(params: float, sharding: str, shard: int,
              state_bytes: tuple[float, float, float], hbm: float,
              per_param: float = 0.0) -> float:
    """Seconds of the Adam step of a rank holding ``params`` local parameters, sharded
    ``sharding`` over ``shard`` ranks, on ``hbm`` bytes/s (0: not priced); ``per_param``
    bytes per updated parameter (0: the fused :func:`step_bytes` of ``state_bytes``)."""
    if hbm <= 0 or params <= 0:
        return 0.0
    moved = per_param if per_param > 0 else step_bytes(*state_bytes)
    return params * updated_share(sharding, shard) * moved / hbm
