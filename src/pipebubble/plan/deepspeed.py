"""DeepSpeed's pipeline engine as a lowering of a planned schedule: the order in which its
``PipelineEngine`` issues blocking P2P (:func:`deepspeed_lowering`) and the step of a plan run
that way, its data-parallel reduction after the flush (:func:`deepspeed_step`).

The planner prices a plan as it runs it (batched P2P, the reduction behind the backward);
``bench/bench_published.py`` prices the runs made on DeepSpeed (MT-NLG, GPT-NeoX-20B, BLOOM)
with this module instead.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.schedule import Kind
from ..sim.wire import lower, run_wire
from .hardware import Hardware
from .network import Network, all_gather, allreduce
from .plans import Plan


def deepspeed_lowering(schedule):
    """``schedule`` (1F1B) lowered to per-rank SEND/RECV programs in the order DeepSpeed's
    PipelineEngine issues them (:class:`~pipebubble.sim.wire.WireSchedule`).

    DeepSpeed's ``TrainSchedule`` (``deepspeed/runtime/pipe/schedule.py``) runs
    ``2 (m + p - 1)`` steps; in each a stage either forwards or backwards one microbatch
    (even stages forward on even steps, odd stages on odd ones), which is 1F1B's compute
    order (tests/test_plan_published.py checks the whole program against that rule). A
    forward step opens with ``SendGrad`` (the previous step's backward output), then
    ``RecvActivation`` (this forward's input); a backward step with ``RecvGrad``, then
    ``SendActivation``. Stage s forwards microbatch m on step ``2 m + s`` and backwards it
    on step ``2 m + 2 p - 1 - s``; its output is sent in the step after its own, which may
    be idle (warm-up, cool-down, fewer microbatches than stages): so the receive comes first
    only where a forward's step is followed by a backward's, elsewhere the send does. Each
    is one blocking ``dist.send`` / ``dist.recv`` (``runtime/pipe/p2p.py``: ``async_op`` is
    refused), so the compute waits until the peer has posted the matching operation.

    >>> from pipebubble.schedules import get_schedule
    >>> print(deepspeed_lowering(get_schedule("1f1b", ranks=2, microbatches=2)).to_text())
    0F0 0SEND_F0 0F1 0RECV_B0 0SEND_F1 0B0 0RECV_B1 0B1
    1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1
    """

    p = schedule.num_ranks
    if schedule.num_stages != p:
        raise ValueError(f"DeepSpeed's pipeline engine runs one stage a rank; got "
                         f"{schedule.num_stages} stages on {p} ranks")

    def step(a) -> int:  # the TrainSchedule step of stage s's forward / backward of m
        s, kind, m = a
        return 2 * m + s if kind == Kind.F else 2 * m + 2 * p - 1 - s

    def recv_first(rank: int, before: tuple, after: tuple) -> bool:  # a forward's step
        return bool(before) and bool(after) and before[-1][1] == Kind.F \
            and after[0][1] != Kind.F and step(after[0]) == step(before[-1]) + 1  # then B's

    return lower(schedule, "deepspeed", recv_first=recv_first)


def partition_gathers(plan: Plan, hw: Hardware, activation_bytes: float) -> tuple[list, list]:
    """Seconds each stage's F and B spend re-assembling the activations DeepSpeed's
    PipelineEngine splits over the TP ranks (``engine.py``: ``is_pipe_partitioned`` and
    ``is_grad_partitioned`` are ``is_model_parallel``, on whenever TP > 1, from the first
    engine, 65c2f97, 2020-09, until #4322 made them optional in 2023-11): a stage sends
    only its rank's 1/t of the boundary activation (``PartitionedTensor``), so

    - a forward on every stage but the first opens with ``PartitionedTensor.full()`` of its
      input, one all-gather over the TP group (``_exec_forward_pass``);
    - a backward on every stage but the last gathers its own output back (its data was
      freed after the send: ``first_output.data = torch.zeros(1)``) and the received
      gradient, two all-gathers (``_exec_backward_pass``).

    Each all-gathers ``activation_bytes`` (the whole boundary activation, ``2 s b h``) on
    the TP group's link. ``([F extra per stage], [B extra per stage])``; zeros at TP 1.

    >>> from types import SimpleNamespace as NS
    >>> from pipebubble.plan.hardware import get_hardware
    >>> hw = replace(get_hardware("a100-80gb"), nvlink_bandwidth=100e9, nvlink_latency=0.0,
    ...              bus_fraction=1.0)
    >>> plan = NS(tp=4, pp=3)
    >>> f, b = partition_gathers(plan, hw, 1e9)  # 3/4 x 1 GB at 100 GB/s: 7.5 ms a gather
    >>> [round(x * 1e3, 1) for x in f], [round(x * 1e3, 1) for x in b]
    ([0.0, 7.5, 7.5], [15.0, 15.0, 0.0])
    """
    t, p = plan.tp, plan.pp
    if t <= 1 or activation_bytes <= 0:
        return [0.0] * p, [0.0] * p
    g = all_gather(activation_bytes, t, Network.of(hw).link(1, t))
    return ([0.0] + [g] * (p - 1), [2 * g] * (p - 1) + [0.0])


def deepspeed_step(plan: Plan, hw: Hardware, tied_params: float = 0.0,
                   activation_bytes: float = 0.0) -> float:
    """The step of ``plan`` (as the planner priced it on ``hw``) on DeepSpeed's
    PipelineEngine, seconds: ``max_r (end_r + DP_r) + tied + optimizer``, where

    - ``end_r`` is rank r's last compute in the wire simulation of the engine's P2P order
      (:func:`deepspeed_lowering`, blocking: ``run_wire(..., blocking=True)``), with the
      plan's stage costs, each F and B with the all-gathers of the activations the engine
      splits over TP (:func:`partition_gathers`, ``activation_bytes`` the whole boundary
      activation of a microbatch; 0: none), and the plan's P2P hop;
    - ``DP_r`` is all of the rank's data-parallel traffic (the plan's per-stage
      ``allreduce``: before + after), none of it overlapped: the engine turns the backward's
      gradient hooks off (``engine.py``: ``self.enable_backward_allreduce = False``, "We
      schedule the all-reduces") and runs ``ReduceTiedGrads``, ``ReduceGrads`` and
      ``OptimizerStep`` in the last step, after the last backward; ZeRO-1's all-gather of
      the updated weights is in the optimizer step, before the next batch's first forward;
    - ``tied`` is the all-reduce of a tied embedding's ``tied_params`` gradients (fp32,
      split over TP) between the first and last stage, priced as the planner prices it (not
      overlapped there either); ``optimizer`` the plan's.
    """

    c = plan.config
    costs = plan.costs
    if plan.tp > 1 and activation_bytes > 0:
        fx, bx = partition_gathers(plan, hw, activation_bytes)
        st = costs.resolve(plan.pp)
        costs = replace(costs, f=[x + y for x, y in zip(st.f, fx, strict=True)],
                        b=[x + y for x, y in zip(st.b, bx, strict=True)])
    tl = run_wire(deepspeed_lowering(plan.schedule_obj), costs, blocking=True).timeline
    end = [max((e.end for e in tl.events(r)), default=0.0) - min(tl.start) for r in
           range(plan.pp)]
    dp = [0.0] * plan.pp
    if c.dims.data_context > 1:
        for s, r in enumerate(plan.stage_to_rank):
            dp[r] += plan.costs.allreduce[s]
    tied = 0.0
    if tied_params > 0 and plan.pp > 1:
        link = Network.of(hw).hop(c.dims.stage_distance(plan.pp - 1))
        tied = allreduce(4.0 * tied_params / c.tp, 2, link)
    return max(e + x for e, x in zip(end, dp, strict=True)) + tied + plan.optimizer_time
