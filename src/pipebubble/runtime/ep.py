"""Expert parallelism (``run --ep N``): each MoE layer's experts spread over N data-parallel
replicas of a stage, tokens sent to their experts and back with ``all_to_all_single``.

**Layout** (Megatron-Core's and torchtitan's, with no context or tensor parallelism). Pipeline
rank ``r`` of replica ``d`` is global rank ``d * P + r``. The ``dp`` replicas of a stage form
``dp / N`` **EP groups** of ``N`` consecutive replicas; member ``k`` of an EP group owns
experts ``k E/N .. (k+1) E/N - 1`` of every MoE layer of its stages (``E`` experts), and only
those (the others are not held: :class:`ExpertParallelMoE` keeps its own in a ModuleDict keyed
by the expert's index, so parameter names stay the unsplit model's, ``experts.2.up.weight``).
The replicas holding the same experts (member ``k`` of every EP group) form the
**expert-data-parallel group** of ``dp / N`` ranks.

>>> expert_layout(ranks=2, dp=4, ep=2)  # P = 2: global rank = replica * 2 + pipeline rank
([[0, 2], [4, 6], [1, 3], [5, 7]], [[0, 4], [2, 6], [1, 5], [3, 7]])

**One MoE layer's forward on a member** (every member of the group runs it at the same step
of the same schedule, so the collectives pair up):

1. route its own tokens (router, softmax, top-k: as :class:`pipebubble.models.moe.MoE`);
2. *dispatch*: sort its (token, slot) assignments by expert (:func:`plan_dispatch`), tell every
   member how many rows it gets for each of its experts (one all-to-all of counts), send the
   token rows (``all_to_all_single`` with uneven splits);
3. run each of its experts on the rows received for it, from every member
   (:func:`expert_rows`);
4. *combine*: send the outputs back the way they came (the reverse all-to-all) and add each
   one, times its routing weight, into its token's output (plus the shared expert).

The backward of an all-to-all is the all-to-all with the splits swapped (:class:`AllToAll`),
so gradients flow back to the tokens' ranks. An expert's weight gradient on its owner sums
over the tokens of the whole EP group; summing it over the expert-data-parallel group gives
the whole global batch's, exactly as the all-reduce over ``dp`` does for every other weight.
The routing weights multiply on the token's own rank, so the router's gradient stays local.
Since nothing is dropped (no capacity), a token's output is the unsplit model's function of
that token, and the gradients equal the unsplit model's (``run --ep 2 --check --dtype
float64`` prints the difference: ~1e-17).

**HuggingFace mixtures of experts** (``mixtral``, ``qwen2_moe``, ``qwen3_moe``,
``deepseek_v3``, :mod:`pipebubble.models.hf`). transformers' MoE block calls its router, then
``experts(tokens, top_k_index, top_k_weights)``, then adds its shared experts; its experts are
two fused tensors. :class:`ExpertParallelHFExperts` takes the place of ``experts`` only: it
holds the member's rows of both tensors (same names, ``E/N`` rows) and sends the tokens
through the same dispatch and combine (:func:`dispatch_combine`), so the router (DeepSeek-V3's
grouped routing and bias included) and the shared experts stay the block's, replicated. A
fused tensor's gradient rows are reduced over the expert-data-parallel group like any
expert's; for the check a member reports its rows (:class:`Rows`), and a checkpoint holds the
whole tensors, gathered over the EP group on save and cut to the own rows on load
(:func:`row_shards`, :func:`gather_rows`), so it is the unsplit model's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ParamError, param

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_DP = param("dp")
_EP = param("ep")
_MODEL = param("model")


def expert_layout(ranks: int, dp: int, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    """(EP groups, expert-data-parallel groups) as lists of global ranks, in the order every
    process creates them: for each pipeline rank, its EP groups, then its EDP groups."""
    blocks = dp // ep
    ep_groups = [[(b * ep + k) * ranks + r for k in range(ep)]
                 for r in range(ranks) for b in range(blocks)]
    edp_groups = [[(b * ep + k) * ranks + r for b in range(blocks)]
                  for r in range(ranks) for k in range(ep)]
    return ep_groups, edp_groups


def owned_experts(experts: int, ep: int, member: int) -> range:
    """The experts member ``member`` of an EP group of ``ep`` owns (contiguous)."""
    per = experts // ep
    return range(member * per, (member + 1) * per)


@dataclass(frozen=True)
class Dispatch:
    """Where one member's (token, slot) assignments go.

    ``rows[i]``/``slots[i]``: token and top-k slot of the i-th row sent, sorted by expert (so
    the rows for member ``j`` are contiguous, and within them those for each of its experts);
    ``counts[j, e]``: rows for member ``j``'s ``e``-th own expert."""

    rows: torch.Tensor
    slots: torch.Tensor
    counts: torch.Tensor  # (members, experts per member), int64


def plan_dispatch(chosen: torch.Tensor, experts: int, members: int) -> Dispatch:
    """Sort the assignments ``chosen`` (tokens x top_k expert indices) by expert.

    >>> d = plan_dispatch(torch.tensor([[3, 0], [1, 0]]), experts=4, members=2)
    >>> d.rows.tolist(), d.slots.tolist(), d.counts.tolist()
    ([0, 1, 1, 0], [1, 1, 0, 0], [[2, 1], [0, 1]])
    """
    flat = chosen.reshape(-1)
    order = torch.sort(flat, stable=True).indices  # stable: ties keep token order
    k = chosen.shape[1]
    counts = torch.bincount(flat, minlength=experts).reshape(members, experts // members)
    return Dispatch(order // k, order % k, counts)


def expert_rows(received: torch.Tensor) -> list[torch.Tensor]:
    """Positions, in the received buffer, of the rows for each own expert.

    ``received[i, e]``: rows member ``i`` sent for own expert ``e``; the buffer holds member
    0's rows first (sorted by expert), then member 1's, and so on.

    >>> [r.tolist() for r in expert_rows(torch.tensor([[2, 1], [0, 1]]))]
    [[0, 1], [2, 3]]
    """
    members, per = received.shape
    counts = received.reshape(-1).tolist()  # one device-to-host copy, then plain integers
    starts = [0, *accumulate(counts)]
    out = []
    for e in range(per):
        parts = [torch.arange(starts[i * per + e], starts[i * per + e] + counts[i * per + e],
                              device=received.device) for i in range(members)]
        out.append(torch.cat(parts))
    return out


Exchange = Callable[..., None]
"""``exchange(out, x, recv_splits, send_splits)``: ``all_to_all_single``'s signature (splits
None: equal); :func:`group_exchange` over a process group, or a test's in-memory one."""


def group_exchange(group) -> Exchange:
    """The exchange over a process group: ``all_to_all_single`` along dim 0."""

    def exchange(out: torch.Tensor, x: torch.Tensor, recv: list[int] | None = None,
                 send: list[int] | None = None) -> None:
        dist.all_to_all_single(out, x, recv, send, group=group)

    return exchange


class AllToAll(torch.autograd.Function):
    """An all-to-all along dim 0 with uneven splits; its backward is the reverse all-to-all
    (the gradient of each row goes back to the rank it came from)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int],
                exchange: Exchange) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.exchange = send, recv, exchange
        out = x.new_empty((sum(recv), *x.shape[1:]))
        exchange(out, x.contiguous(), recv, send)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        ctx.exchange(out, grad.contiguous(), ctx.send, ctx.recv)
        return out, None, None, None


class ExpertParallelMoE(nn.Module):
    """One member's part of an :class:`~pipebubble.models.moe.MoE` layer: the router and the
    shared expert (replicated, as every non-expert weight), and its own experts only.
    ``exchange`` moves rows between the members (:func:`group_exchange`)."""

    def __init__(self, moe: nn.Module, members: int, member: int, exchange: Exchange):
        super().__init__()
        self.top_k, self.members, self.exchange = moe.top_k, members, exchange
        self.num_experts = len(moe.experts)
        self.router = moe.router
        self.own = owned_experts(self.num_experts, members, member)
        self.experts = nn.ModuleDict({str(e): moe.experts[e] for e in self.own})
        self.shared = moe.shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.router(tokens), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = dispatch_combine(tokens, chosen, weights, self.num_experts, self.members,
                               self.exchange, self.own,
                               lambda e, rows: self.experts[str(e)](rows))
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.view_as(x)


def dispatch_combine(tokens: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor,
                     experts: int, members: int, exchange: Exchange, own: range,
                     expert: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The routed experts' part of one MoE layer on one member (steps 2-4 of the module
    doc): ``tokens`` (n x dim) routed to ``chosen`` (n x top_k expert indices) with
    ``weights`` (n x top_k), over ``members`` members of which this one owns the experts
    ``own``; ``expert(e, rows)`` runs own expert ``e`` on rows. Returns ``sum_k weights[t, k]
    expert_{chosen[t, k]}(tokens[t])`` for every token ``t`` (n x dim, ``tokens``' dtype).

    Collective over the EP group: every member calls it for the same layer at the same step.
    The built-in MoE (:class:`ExpertParallelMoE`) and the HuggingFace experts
    (:class:`ExpertParallelHFExperts`) both run through it."""
    plan = plan_dispatch(chosen, experts, members)
    got = torch.empty_like(plan.counts)  # got[i, e]: rows member i sends my expert e
    exchange(got.reshape(-1), plan.counts.reshape(-1), None, None)
    send, recv = plan.counts.sum(1).tolist(), got.sum(1).tolist()
    rows = AllToAll.apply(tokens[plan.rows], send, recv, exchange)  # dispatch
    done = torch.zeros_like(rows)
    for e, where in zip(own, expert_rows(got), strict=True):
        done = done.index_add(0, where, expert(e, rows[where]).to(done.dtype))
    back = AllToAll.apply(done, recv, send, exchange)  # combine
    scaled = back * weights[plan.rows, plan.slots, None]
    return torch.zeros_like(tokens).index_add(0, plan.rows, scaled.to(tokens.dtype))


class ExpertParallelHFExperts(nn.Module):
    """One member's part of a HuggingFace MoE block's experts (``mixtral``, ``qwen2_moe``,
    ``qwen3_moe``, ``deepseek_v3``: transformers' ``*Experts`` module, :data:`HF_EXPERTS`).

    transformers keeps a layer's ``E`` experts fused, ``gate_up_proj`` (``E x 2f x h``) and
    ``down_proj`` (``E x h x f``); expert ``e`` computes ``down_e(act(gate_e x) * up_e x)``
    with ``gate_e, up_e`` the two halves of ``gate_up_proj[e] x``. This module holds rows
    ``own`` of both (``E/N`` experts: :attr:`start` is the first), under the same names, and
    takes the block's call unchanged, ``experts(tokens, top_k_index, top_k_weights)``: the
    block's router (DeepSeek-V3's grouped routing and bias included) and its shared experts
    stay the block's own, replicated. The tokens go through :func:`dispatch_combine`, the
    built-in MoE's dispatch."""

    def __init__(self, experts: nn.Module, members: int, member: int, exchange: Exchange):
        super().__init__()
        self.num_experts, self.members, self.exchange = experts.num_experts, members, exchange
        self.own = owned_experts(self.num_experts, members, member)
        self.start = self.own.start
        rows = slice(self.own.start, self.own.stop)
        gate_up, down = experts.gate_up_proj, experts.down_proj
        # copies of the own rows (contiguous): the fused tensors are freed with the module
        self.gate_up_proj = nn.Parameter(gate_up.detach()[rows].clone(),
                                         requires_grad=gate_up.requires_grad)
        self.down_proj = nn.Parameter(down.detach()[rows].clone(),
                                      requires_grad=down.requires_grad)
        self.act_fn = experts.act_fn

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Own expert ``e`` (its index in the layer) on rows ``x``: transformers' formula."""
        i = e - self.start
        gate, up = nn.functional.linear(x, self.gate_up_proj[i]).chunk(2, dim=-1)
        return nn.functional.linear(self.act_fn(gate) * up, self.down_proj[i])

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return dispatch_combine(hidden_states, top_k_index, top_k_weights, self.num_experts,
                                self.members, self.exchange, self.own, self.expert)


HF_EXPERTS = ("MixtralExperts", "Qwen2MoeExperts", "Qwen3MoeExperts", "DeepseekV3Experts")
"""transformers' fused expert modules :class:`ExpertParallelHFExperts` shards (their forward
is the formula of :meth:`ExpertParallelHFExperts.expert`; tests/test_run_ep_hf.py checks it
against transformers' own on each)."""


def _is_hf_experts(module: nn.Module) -> bool:
    return (type(module).__name__ in HF_EXPERTS
            and {n for n, _ in module.named_parameters()} == {"gate_up_proj", "down_proj"}
            and module.gate_up_proj.shape[0] == module.num_experts)


def moe_layers(module: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, layer) of every layer of ``module`` expert parallelism shards:
    the built-in MoE (:class:`~pipebubble.models.moe.MoE`) and transformers' fused experts
    (:data:`HF_EXPERTS`)."""
    from ..models.moe import MoE

    return [(parent, name, child) for parent in module.modules()
            for name, child in parent.named_children()
            if isinstance(child, MoE) or _is_hf_experts(child)]


def experts_of(layer: nn.Module) -> int:
    """How many experts a layer of :func:`moe_layers` has."""
    return int(layer.num_experts) if _is_hf_experts(layer) else len(layer.experts)


def check_ep(ep: int, dp: int, layers: list[nn.Module], model: str) -> None:
    """``--ep``: a model with MoE layers, ``ep`` dividing ``--dp`` and every layer's experts."""
    if ep == 1:
        return
    found = [moe for layer in layers for _, _, moe in moe_layers(layer)]
    if not found:
        raise ParamError(f"{_EP} {ep}: {_MODEL} {model} has no mixture-of-experts layers "
                         f"(models/moe.py's MoE, as in {_MODEL} moe, or a HuggingFace MoE's "
                         f"experts); use {_EP} 1")
    if dp % ep:
        raise ParamError(f"{_EP} {ep} must divide {_DP} {dp} (an EP group is {_EP} of a stage's "
                         f"data-parallel replicas); valid: a divisor of {dp}")
    for moe in found:
        if experts_of(moe) % ep:
            raise ParamError(f"{_EP} {ep} must divide the experts of every MoE layer, got "
                             f"{experts_of(moe)} experts; valid: a divisor of "
                             f"{experts_of(moe)}")


def shard_experts(module: nn.Module, members: int, member: int, exchange: Exchange) -> int:
    """Replace every MoE layer of ``module`` by its :class:`ExpertParallelMoE` (a
    HuggingFace block's experts by their :class:`ExpertParallelHFExperts`), in place;
    returns how many. The experts this member does not own are dropped (freed)."""
    found = moe_layers(module)
    for parent, name, moe in found:
        cls = ExpertParallelHFExperts if _is_hf_experts(moe) else ExpertParallelMoE
        setattr(parent, name, cls(moe, members, member, exchange))
    return len(found)


def expert_parameter_ids(module: nn.Module) -> set[int]:
    """``id`` of every expert parameter in ``module`` (reduced over the expert-data-parallel
    group, not the full data-parallel one)."""
    out = set()
    for m in module.modules():
        if isinstance(m, ExpertParallelMoE):
            out |= {id(p) for p in m.experts.parameters()}
        elif isinstance(m, ExpertParallelHFExperts):
            out |= {id(m.gate_up_proj), id(m.down_proj)}
    return out


@dataclass(frozen=True)
class Rows:
    """Rows ``start .. start + len(value) - 1`` (dim 0) of an unsplit model's tensor of
    ``total`` rows: a HuggingFace fused expert tensor's own rows, as a member holds them."""

    value: torch.Tensor
    start: int
    total: int

    def of(self, full: torch.Tensor) -> torch.Tensor:
        """The same rows of the unsplit tensor ``full``."""
        return full[self.start:self.start + self.value.shape[0]]


def row_shards(module: nn.Module) -> dict[int, tuple[int, int]]:
    """``id`` of each fused expert tensor ``module`` holds part of -> (first row, rows of the
    unsplit tensor): the parameters whose checkpoint entry and check need the other
    members' rows too (:class:`Rows`, :func:`gather_rows`)."""
    return {id(p): (m.start, m.num_experts) for m in module.modules()
            if isinstance(m, ExpertParallelHFExperts) for p in (m.gate_up_proj, m.down_proj)}


def gather_rows(part: torch.Tensor, group) -> torch.Tensor:
    """The unsplit tensor from every EP member's equal share of its rows (member order is
    row order, :func:`owned_experts`): an all-gather over the EP ``group``."""
    parts = [torch.empty_like(part) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, part.contiguous(), group=group)
    return torch.cat(parts)
