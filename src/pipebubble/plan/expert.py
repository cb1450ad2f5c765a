"""Mixture-of-experts layers on the planner's axes: compute, the expert-parallel axis and
its all-to-all.

How ``plan --gpu NAME`` prices an MoE profile (``profile --analytic --hf-config`` of a
mixtral, qwen2_moe, qwen3_moe or deepseek_v3 config; the shape is
:class:`~pipebubble.plan.moe.MoEShape`). One block on one rank, ``T = s b / cp`` tokens,
``t`` the TP degree, ``ep`` the EP degree, ``E`` routed experts of inner size ``f_e``, top
``k``, ``u`` the load-imbalance factor (``--moe-imbalance``); GEMMs ``(m, n, k)`` priced by
:mod:`~pipebubble.plan.compute` (FP8 under ``--precision fp8``, the router in 16-bit):

- **attention**: grouped-query (QKV ``(T, (q + 2 kv)/t, h)``, O ``(T, h, q/t)``) or
  DeepSeek's latent attention (Q down ``(T, r_q, h)``, Q up ``(T, a d_qk / t, r_q)``, KV
  down ``(T, r_kv + d_rope, h)``, KV up ``(T, a (d_nope + d_v) / t, r_kv)``, O
  ``(T, h, a d_v / t)``), FlashAttention over ``a (d_qk + d_v) / 2`` per head-pair width,
  TP's two collectives each way (:mod:`~pipebubble.plan.tensor`) and CP's ring
  (:mod:`~pipebubble.plan.context`) as for a dense block;
- **router** ``(T, E, h)``; **shared experts** as a dense SwiGLU MLP of ``n_s f_s``;
- **routed experts**: each EP rank holds ``E / ep`` experts and computes the tokens routed to
  them, on average the ``T k`` its own tokens send out, ``u`` times that on the busiest rank
  (the step waits for it): per local expert a grouped GEMM of ``T k u ep / (g E)`` rows,
  ``(rows, 2 f_e / e, h)`` and ``(rows, h, f_e / e)``, with ``e`` the expert-tensor-parallel
  degree (``ParallelDims.etp``: ``t`` by default, Megatron-Core's) and ``g = t / e`` (below 1
  at ``e > t``) the ETP groups of a TP group, each serving ``1 / g`` of its tokens. Without
  EP one rank runs all ``E`` experts on ``T k / E`` rows each, which the shape curve prices
  as thin GEMMs. Two layouts (:func:`etp_block_comm`): at ``e = t`` torchtitan 0.2's (the
  planner's before ETP had a degree; ``--framework torchtitan``, ``deepspeed``, ``none``):
  the MLP's all-gather / reduce-scatter on the TP group's ``T`` tokens, as a dense block;
  at every other ``e``, and at ``e = t`` under ``--framework megatron`` or ``nemo``
  (:attr:`MoERecipe.megatron_dispatch`), Megatron-Core's all-to-all dispatcher: the
  attention's and shared experts' pairs over TP, and the ``T k u / g``
  dispatched copies all-gathered over the ETP group after the all-to-all and their output
  reduce-scattered before the combine, never hidden;
- **all-to-all** (:func:`all_to_all_time`): dispatch and combine in the forward, their
  gradients in the backward, four per MoE layer and microbatch, each moving ``T k u h``
  16-bit values per rank in torchtitan's layout (the TP group's copies), ``T k u h / t``
  in Megatron-Core's (the rank's own), ``(ep - 1) / ep`` of them off the rank (the EP group ``etp``
  ranks apart);
- **dense layers** (DeepSeek-V3's first three): a SwiGLU MLP of ``dense_ffn``.

F holds the attention, the MLP and its two all-to-alls, I (the input gradient) the data
gradients, the backward all-to-alls and twice the memory-bound work, W the weight gradients;
full recomputation re-runs F (its all-to-alls too). The planner's :class:`~pipebubble.costs.
CostModel` gets the expert-parallel communication of F and of the backward as ``a2a_f`` and
``a2a_b``: the all-to-alls and, in Megatron-Core's dispatcher layout, the routed experts'
ETP all-gather / reduce-scatter (:func:`etp_pair_time`), which sit between the dispatch and
the experts and between the experts and the combine, where the all-to-alls sit: ``f`` and
``b`` stay the whole action times, that communication exposed; DualPipe's overlapped F&B
pairs hide one half's communication behind the other's compute
(:meth:`~pipebubble.costs.StageCosts.pair_duration`), the ETP pair with the all-to-all (a
chunk's dispatch phase, all-to-all then all-gather, runs while the other chunk computes, as
the combine phase does; DeepSeek-V3 ran no TP, so its report does not say; Megatron-Core's
own F&B overlap, ``--overlap-moe-expert-parallel-comm``, runs the ETP pair in its "mlp"
node on the compute stream, ``models/gpt/fine_grained_callables.py`` and
``models/common/model_chunk_schedule_plan.py`` in core 0.16.1, but it pairs 1F1B chunks,
which the planner prices unpaired). The attention's and shared experts' TP collectives stay
out of it (they feed compute in the chunk itself).

**The EP axis** (Megatron-Core ``--expert-model-parallel-size``, torchtitan
``expert_parallel_degree``): an EP group is ``ep`` ranks ``etp`` apart (at ``etp = tp``
consecutive ranks of the ``cp x dp`` grid), carved out of ``tp / etp x dp x cp`` under
Megatron-Core's folding (any data-parallel rank, replicated or sharded: Megatron-LM, NeMo,
DeepSpeed, ``none``), of ``tp / etp x dp_shard x cp`` under torchtitan's mesh
(:class:`~pipebubble.plan.dims.ParallelDims` ``ep_from``); ``ep`` must divide ``E``. The
ranks ``etp x ep`` apart holding the same experts form the expert-data-parallel group of
``tp x cp x dp / (etp x ep)`` ranks: the experts' weights, gradients and optimizer states
are ``1 / (etp ep)`` per rank and sharded over that group as the sharding shards dense
states over ``dp x cp`` (replicated under ddp; :meth:`~pipebubble.plan.axes.Axes.
expert_bytes_per_param`), their gradients reduced over it (:meth:`~pipebubble.plan.axes.
Axes.expert_sync`), behind the same last backward as the dense gradients, or per microbatch
with FSDP's gathers when the weights are resharded ``always``.

**HSDP** (torchtitan 0.3.0, the only framework here that runs it): EP is carved out of the
shard group, ``tp / etp x dp_shard x cp``, under either rule
(:attr:`~pipebubble.plan.dims.ParallelDims.hybrid`; its sparse mesh ``pp x dp_replicate x
efsdp x ep``, ``distributed/parallel_dims.py`` ``ParallelDims.build_mesh``), and the
experts' states are sharded over ``efsdp = tp x cp x dp_shard / (etp x ep)`` and replicated
over ``dp_replicate``: ``models/deepseek_v3/parallelize.py`` ``parallelize_deepseekv3``
passes ``edp_mesh = ["dp_replicate", "efsdp"]`` to ``distributed/fsdp.py``
``apply_fsdp_to_decoder``, whose ``shard_placement_fn`` puts the routed experts' parameters
on that mesh and the rest of the block on the dense ``["dp_replicate", "fsdp"]``. Their
traffic is HSDP's over the experts' own groups: gathers and a reduce-scatter over
``efsdp`` (``etp x ep`` ranks apart, inside the shard group's node), then an all-reduce of
``1 / efsdp`` of the gradient over ``dp_replicate`` (``tp x cp x dp_shard`` apart, one
member a node), once a step resharded ``never`` (torchtitan under PP), every microbatch
resharded ``always``.

**The load-imbalance factor** ``u`` (``--moe-imbalance``, >= 1): the busiest EP rank's
tokens over the mean. A router with a capacity factor ``C`` drops what exceeds ``C`` times
the mean, so ``u = C`` is its worst case and the default when the profile names one
(``capacity_factor`` in the shape's ``extra``); the HF configs of the four models name none
(their routers drop nothing), and the default is then 1.0, perfectly even routing, which
auxiliary-loss or bias balancing approaches but never reaches: give ``--moe-imbalance
1.1`` or more for a margin. No published measurement of the busiest rank's load for these
models was found to set it from (:func:`default_imbalance`). It scales the routed experts'
compute, their dispatched activations and the all-to-all bytes.

**Group-limited routing** (DeepSeek-V3's ``n_group`` / ``topk_group``: each token to at most
4 of 8 nodes) is priced as DeepSeek dispatches it, each token crossing once to each remote
node it reaches and forwarded over NVLink there (:func:`routed_shares`); without it every
routed copy travels alone, as Megatron-Core's and torchtitan's all-to-all dispatchers send it.

**A framework's recipe** (:class:`MoERecipe`, ``Request.moe_recipe``; off by default): FP8
dispatch, block-scaled FP8 casts as HBM round trips, FP8 GEMMs' efficiency relative to bf16,
the SMs communication holds while it overlaps compute, MTP modules on the head's stage,
the MLA up-projections recomputed, FP8 activation caching, the gate weights applied in the
SwiGLU (no expert outputs kept) and a dispatch kernel's measured bandwidth;
:meth:`MoERecipe.deepseek_v3` is DeepSeek-V3's.

**What is not priced**: the permutation kernels' exact traffic (counted as four reads and
writes of the dispatched tokens) and the aux-loss FLOPs. FSDP's per-microbatch gathers of a
layer's experts and of its other weights are two collectives, one after the other, each
over its own group.

>>> from pipebubble.plan.network import Network
>>> net = Network(8, (100e9, 0.0), (10e9, 0.0))
>>> all_to_all_time(16e6, ep=8, tp=1, net=net)    # one node: 7/8 of 16 MB over NVLink
0.00014
>>> all_to_all_time(16e6, ep=16, tp=1, net=net)   # two nodes: 8/16 of it over the NIC
0.0008
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ParamError, UserError, marked, param
from .compute import Rates, attention_backward_time, attention_time, gemm_time, memory_time
from .context import block_cp_comm
from .dims import ParallelDims, check_etp_sp, etp_groups
from .layercosts import LayerCosts
from .memory import embedding_activation_bytes, head_activation_bytes
from .moe import LatentAttention, MoEShape, layer_cost
from .network import Network, all_gather, reduce_scatter
from .parallel_costs import MODES, ParallelCosts
from .tensor import block_tp_comm, block_tp_hidden, pipelined_pair, sp_collective

ACT_BYTES = 2  # 16-bit activations on the wire
PROBS_BYTES = 4  # the routing probabilities' dtype: fp32 (--moe-router-dtype fp32)
DEFAULT_IMBALANCE = 1.0
FP8_WIRE_BYTES = 1 + 4 / 128  # an FP8 value and its share of a 1 x 128 tile's fp32 scale
E5M6_BYTES = 1.5 + 4 / 128  # a 12-bit E5M6 value and its 1 x 128 tile's scale
DEEPEP_H800 = ((16, 43e9, 43e9), (32, 58e9, 57e9), (64, 51e9, 50e9))
"""DeepEP's normal kernels on H800 with one CX7 400 Gb/s NIC a GPU, in DeepSeek-V3's
pretraining setting (4,096 tokens a rank, hidden 7,168, top-4 groups, top-8 experts, FP8
dispatch, BF16 combine): (EP, dispatch, combine) "bottleneck bandwidth" over RDMA
(deepseek-ai/DeepEP README at its release, February 2025, "Normal kernels with NVLink and
RDMA forwarding"; now docs/legacy.md), counted per token copy to each node reached, its own
node's included (:attr:`MoERecipe.a2a_measured`)."""


@dataclass(frozen=True)
class MoERecipe:
    """How a framework runs an MoE model beyond its axes: what the planner prices when asked
    (all off by default: Megatron-Core's all-to-all dispatcher in 16-bit, per-tensor FP8
    with its casts fused, no extra modules). DeepSeek-V3's run is :meth:`deepseek_v3`.

    - ``fp8_dispatch``: the forward's dispatch and the backward's combine gradient (the
      tokens sent to the experts, and the gradient sent to their down-projections) travel
      in FP8 with a 1 x 128 tile's fp32 scale (:data:`FP8_WIRE_BYTES` a value); the
      forward's combine and the backward's dispatch gradient in 16-bit.
    - ``block_scaling``: FP8 with fine-grained scaling (1 x 128 tiles for activations,
      128 x 128 blocks for weights) whose quantization is not fused into the GEMMs: each FP8
      GEMM input is read in 16-bit and written back in FP8 (3 bytes a value and the scale)
      before the GEMM reads it; in the backward each output gradient is quantized twice
      (1 x 128 for the data gradient, 128 x 1 for the weight gradient: read 2, write 1 + 1)
      and each stored FP8 activation a weight gradient reads is transposed and re-quantized
      (read 1, write 1). Memory-bound work at the HBM rate.
    - ``fp8_gemm_ratio``: the fraction of the FP8 peak FP8 GEMMs reach, over the fraction of
      the bf16 peak bf16 GEMMs reach (1.0: the same efficiency for both peaks).
    - ``comm_sms``: the share of the SMs the all-to-all's kernels hold while they overlap
      compute (:class:`~pipebubble.costs.CostModel`).
    - ``mtp_layers``: multi-token-prediction modules on the last stage, each one more MoE
      block, a ``2h x h`` projection and one more pass through the (shared) output head.
    - ``recompute_latent``: the backward re-runs the MLA up-projections (Q and KV) and every
      RMSNorm instead of keeping their outputs. In memory (:meth:`ExpertCosts.
      recipe_activation_savings`): the two normed block inputs (the attention's and the
      MLP's, ``4 T h``), the normed latents (``2 T (r_q + r_kv)``) and Q, K, V (``2 T a
      (2 d_qk + d_v)``) are not kept; the latents themselves and the norms' inputs are.
      The re-run tensors of one block live during its backward (the ``transient`` column).
    - ``fp8_activations``: FP8 activation caching (the FP8 weight-gradient GEMMs read their
      inputs in FP8): the inputs of the Linear after attention in E5M6 with a power-of-2
      1 x 128 scale (1.5 + 4/128 bytes a value), the MoE up-projections' inputs (the
      dispatched tokens, arriving in FP8) and the SwiGLU inputs (gate and up) of the shared
      and routed experts in FP8 (:data:`FP8_WIRE_BYTES`), the SwiGLU product re-computed in
      the backward; in a dense MLP its down-projection input in FP8. What stays 16-bit: the
      norms' inputs, the latents, the router's fp32 probabilities, the expert outputs the
      combine's backward reads (the gate weights' gradient; :attr:`weighted_swiglu` drops
      them), the dense MLP's gate and up.
    - ``weighted_swiglu``: each routed copy's gate weight multiplies its SwiGLU product,
      before the down-projection (its linearity gives the same output), instead of the
      expert's output: the gate weight's gradient is then the SwiGLU product (re-computed
      under ``fp8_activations``, kept otherwise) dotted with the down-projection's input
      gradient, and no expert output is kept for the combine's backward (``2 h`` bytes a
      routed copy less). Megatron-Core's ``WeightedSwiGLUFunction``
      (``megatron/core/fusions/fused_bias_swiglu.py``: it saves the SwiGLU input and the
      weights, and its backward forms the weights' gradient from the re-computed product)
      runs it; DeepEP's combine is an "addition without weights" (``deep_ep/buffer.py``,
      ``Buffer.combine``), so DeepSeek's weights are applied on the experts' side, and the
      report caches only the SwiGLU inputs (section 3.3.3).
    - ``a2a_measured``: the dispatch and combine kernels' measured bandwidth over the NICs
      by EP degree, ``((ep, dispatch bytes/s, combine bytes/s), ...)``, as DeepEP's normal
      kernels count it: one copy of a token to each node it reaches, its own node's
      included (``tests/test_internode.py``: ``num_rdma_token_sent`` counts the distinct
      nodes of each token's experts), so a token routed to ``n`` nodes costs ``n`` copies at
      that rate; under group-limited routing only (DeepEP's node-limited forwarding). The
      dispatch rate for the FP8 pair (the forward's dispatch and the backward's
      combine-gradient), the combine rate for the 16-bit pair; an EP degree not listed keeps
      the network's rate (:func:`all_to_all_time`).
    - ``megatron_dispatch``: at ``etp = tp > 1`` with SP, Megatron-Core's layout (set by
      ``plan --framework megatron`` or ``nemo``, :func:`~pipebubble.plan.frameworks.apply`)
      instead of torchtitan 0.2's. Megatron-Core (core 0.16.1,
      ``transformer/moe/token_dispatcher.py``) runs ``MoEAlltoAllTokenDispatcher`` the same
      at every etp: "A2A(EP) -> AG(TP)" before the experts and "RS(TP) -> A2A(EP)" after,
      its TP group ``pg_collection.expt_tp`` (the TP ranks at its default etp = tp), so each
      rank sends its own sequence shard's ``T k u / tp`` copies and the ``T k u`` copies are
      gathered over the group (:func:`etp_block_comm`). torchtitan 0.2.2
      (``torchtitan/models/llama4/infra/parallelize.py``, ``apply_moe_ep_tp``) all-gathers
      the MoE input over TP (``Shard(1)`` to ``Replicate()``), routes the whole TP group's
      ``T`` tokens on every TP rank and reduce-scatters the output (``Partial()`` to
      ``Shard(1)``); its ``ExpertTensorParallel._token_dispatch``
      (``torchtitan/distributed/expert_parallel.py``) sends that replicated input over EP:
      ``T k u`` copies a rank, no gather after it. Off: torchtitan's (the planner's own
      default, ``--framework none``). Other etp are Megatron-Core's layout either way.

    Memory the planner already counts as DeepSeek-V3 runs it: the MTP module's embedding and
    head are the main model's, no parameters of their own; the MTP module needs the
    embedding on the head's stage, so where the head's rank holds none (loop placements:
    1F1B, interleaved) it keeps a copy and all-reduces its gradient with the embedding's
    rank, as a tied embedding's copy (``LayerCosts.tied``); under a V placement (rank 0
    holds both ends) and DualPipe (the head's rank holds the other chain's first stage) it
    shares the embedding already there; the EMA of
    the parameters, kept in CPU memory, takes no GPU memory (the planner counts none); the
    low-precision optimizer states are ``Request.state_bytes`` (``--param-bytes``, ``--grad-bytes``,
    ``--optimizer-bytes``: 8 for an fp32 master and bf16 AdamW moments, 4 for fp32
    gradients).
    """

    fp8_dispatch: bool = False
    block_scaling: bool = False
    fp8_gemm_ratio: float = 1.0
    comm_sms: float = 0.0
    mtp_layers: int = 0
    recompute_latent: bool = False
    fp8_activations: bool = False
    weighted_swiglu: bool = False
    megatron_dispatch: bool = False
    a2a_measured: tuple[tuple[int, float, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("fp8_dispatch", "block_scaling", "recompute_latent", "fp8_activations",
                     "weighted_swiglu", "megatron_dispatch"):
            if not isinstance(getattr(self, name), bool):
                raise ParamError(f"MoERecipe.{name} must be true or false, got "
                                 f"{getattr(self, name)!r}")
        r = self.fp8_gemm_ratio
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r <= 1:
            raise ParamError(f"MoERecipe.fp8_gemm_ratio must be in (0, 1] (FP8 GEMMs' "
                             f"efficiency over bf16's), got {r!r}")
        c = self.comm_sms
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0 <= c < 1:
            raise ParamError(f"MoERecipe.comm_sms must be in [0, 1) (the share of the SMs "
                             f"communication holds), got {c!r}")
        m = self.mtp_layers
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ParamError(f"MoERecipe.mtp_layers must be an integer >= 0, got {m!r}")
        rows = self.a2a_measured
        ok = isinstance(rows, tuple) and all(
            isinstance(r, tuple) and len(r) == 3 and isinstance(r[0], int)
            and not isinstance(r[0], bool) and r[0] > 1
            and all(isinstance(x, int | float) and not isinstance(x, bool)
                    and math.isfinite(x) and x > 0 for x in r[1:]) for r in rows)
        if not ok:
            raise ParamError(f"MoERecipe.a2a_measured must be a tuple of (ep > 1, dispatch "
                             f"bytes/s > 0, combine bytes/s > 0) rows, got {rows!r}")

    def a2a_rates(self, ep: int) -> tuple[float, float] | None:
        """(dispatch, combine) bytes/s measured at ``ep`` (:attr:`a2a_measured`), None when
        not listed."""
        for e, d, c in self.a2a_measured:
            if e == ep:
                return float(d), float(c)
        return None

    @classmethod
    def deepseek_v3(cls, fp8_gemm_ratio: float = 1.0) -> MoERecipe:
        """DeepSeek-V3's training recipe as its technical report (arXiv 2412.19437) states
        it: FP8 dispatch, BF16 combine (section 3.3.4, "Low-Precision Communication");
        tile- and block-wise quantization done outside the GEMMs (section 3.3.2; section
        3.5.2: activations are "read ... from HBM for quantization, and the quantized FP8
        values are then written back to HBM, only to be read again for MMA", and transposed
        and re-quantized for the backward); 20 of the H800's 132 SMs given to communication
        (section 3.2.2); one MTP module (section 2.2, ``num_nextn_predict_layers`` 1);
        RMSNorm and the MLA up-projections recomputed in the backward (section 3.2.3); FP8
        activation caching, E5M6 for the attention output projection's input (section
        3.3.3, "Low-Precision Activation"). Beyond the report: the gate weights applied in
        the SwiGLU (``weighted_swiglu``: DeepEP's combine adds without weights, and the
        report keeps only the SwiGLU inputs) and DeepEP's measured all-to-all bandwidth on
        H800 (:data:`DEEPEP_H800`). The FP8 kernels' efficiency is not in the report: pass
        it."""
        return cls(fp8_dispatch=True, block_scaling=True, fp8_gemm_ratio=fp8_gemm_ratio,
                   comm_sms=20 / 132, mtp_layers=1, recompute_latent=True,
                   fp8_activations=True, weighted_swiglu=True, a2a_measured=DEEPEP_H800)


RECIPES = ("deepseek-v3", "none")


def recipe_named(name: str, fp8_gemm_ratio: float = 1.0) -> MoERecipe:
    """``plan --moe-recipe NAME``: ``deepseek-v3`` (:meth:`MoERecipe.deepseek_v3` at
    ``fp8_gemm_ratio``) or ``none`` (off). One line naming the valid ones otherwise."""
    if name == "deepseek-v3":
        return MoERecipe.deepseek_v3(fp8_gemm_ratio)
    if name == "none":
        return NO_RECIPE
    raise ParamError(f"{param('moe_recipe')} must be one of {', '.join(RECIPES)}, "
                     f"got {name!r}")


NO_RECIPE = MoERecipe()


# ---- the all-to-all ------------------------------------------------------------------------
def all_to_all_time(nbytes: float, ep: int, tp: int, net: Network,
                    shares: tuple[float, float] | None = None, nic_rate: float = 0.0) -> float:
    """Seconds of one all-to-all in which each of ``ep`` ranks (``tp`` apart) sends
    ``nbytes``, ``1 / ep`` of it to each member (its own share stays): the ``m - 1`` other
    members in its node (``m`` = members a node, :meth:`~pipebubble.plan.network.Network.
    members_per_node`) get ``(m - 1) / ep`` of it over NVLink, the ``ep - m`` in other nodes
    ``(ep - m) / ep`` through the rank's share of its node's NICs (every GPU sends at once:
    :meth:`~pipebubble.plan.network.Network.hop`); both run at once, so the slower one plus
    one message latency. ``shares``: other (NVLink, NIC) fractions of ``nbytes``
    (:func:`routed_shares`); ``nic_rate``: the bytes/s the NIC part moves at (a measured
    kernel's, :attr:`MoERecipe.a2a_measured`) instead of the network's."""
    if ep <= 1 or nbytes <= 0:
        return 0.0
    m = net.members_per_node(tp, ep)
    on, off = shares if shares is not None else ((m - 1) / ep, (ep - m) / ep)
    intra = nbytes * on / net.intra[0]
    if ep <= m:
        return intra + net.intra[1]
    bw, lat = net.hop(net.gpus_per_node)  # across nodes: the GPU's share of the NICs
    return max(intra, nbytes * off / (nic_rate or bw)) + lat


def routed_shares(shape: MoEShape, ep: int, members: int, own_node: bool = False
                  ) -> tuple[float, float] | None:
    """(NVLink, NIC) fractions of a rank's ``T k`` dispatched copies under DeepSeek's
    group-limited routing, None without it (every copy then travels alone,
    :func:`all_to_all_time`'s default). With ``G`` expert groups spread evenly over the ``N``
    nodes of an EP group (``G`` a multiple of ``N``: ``G / N`` groups a node) and each token
    routed within its ``g`` best groups, a token reaches a given node with probability
    ``1 - C(G - G/N, g) / C(G, g)``; DeepSeek's dispatch sends it once to each remote node
    it reaches and forwards it over NVLink there (arXiv 2412.19437, section 3.2.2), so the
    NIC carries ``(N - 1) x`` that probability over ``k`` of the copies, and NVLink the
    ``(m - 1) / m`` of the copies that land on another GPU of their node. DeepSeek-V3 on 8
    nodes (``G = 8``, ``g = 4``): 3.5 crossings a token, not the 7 of its 8 copies.
    ``own_node``: the NIC part counts the copy to the token's own node too, ``N`` x that
    probability (4 a token here), as DeepEP's measured bandwidth counts it
    (:attr:`MoERecipe.a2a_measured`)."""
    G, g = shape.expert_groups, shape.group_top_k
    nodes = ep // members if ep > members else 1
    if not G or not g or nodes <= 1 or G % nodes:
        return None
    reach = 1 - math.comb(G - G // nodes, g) / math.comb(G, g)
    k = shape.top_k
    if own_node:
        return (members - 1) / members, min(nodes * reach / k, 1.0)
    return (members - 1) / members, min((nodes - 1) * reach / k, (ep - members) / ep)


def replicated_block_comm(tokens: float, hidden: int, tp: int, net: Network,
                          hide: tuple[float, float], hide_dgrad: tuple[float, float],
                          attention: tuple[float, float], dgrad_o: float
                          ) -> tuple[float, float, float]:
    """(forward, backward, hidden by a fused B) seconds of an MoE block's TP collectives
    in torchtitan's layout at ``etp = tp`` under ``--tp-overlap on`` (SP): the attention's
    pair pipelined with QKV and O (``attention``: their forward seconds; ``dgrad_o``: O's
    data gradient), as a dense block's under torchtitan's AsyncTP; the MoE's pair (the
    all-gather of its input before the router, the shared and the routed experts, the
    reduce-scatter of their summed output) exposed: no single GEMM reads the one or writes
    the other (:func:`~pipebubble.plan.tensor.sp_collective`). Without ``--tp-overlap on``
    the block is :func:`~pipebubble.plan.tensor.block_tp_comm`'s."""
    a = pipelined_pair(tokens, hidden, tp, net, hide[0], hide_dgrad[0], attention, dgrad_o)
    m = sp_collective(tokens, hidden, tp, net, hide[1], hide_dgrad[1])
    return a[0] + m[0], a[1] + m[1], a[2] + m[2]


def etp_block_comm(tokens: float, hidden: int, tp: int, etp: int, net: Network,
                   hide: tuple[float, float], hide_dgrad: tuple[float, float], shared: bool,
                   rows: float, fwd_gemms: tuple[float, ...] = (),
                   dgrad_rows: tuple[float, ...] = ()) -> tuple[float, float, float]:
    """(forward, backward, hidden by a fused B) seconds of an MoE block's TP and ETP
    collectives at an etp other than tp, as Megatron-Core's all-to-all dispatcher runs them
    (``MoEAlltoAllTokenDispatcher``: "A2A(EP) -> AG(TP)" before the experts, "RS(TP) ->
    A2A(EP)" after them, its TP the expert-tensor group): the attention's sequence-parallel
    all-gather / reduce-scatter pair over the TP group on the ``tokens``, the shared
    experts' pair likewise (``shared``: a dense MLP over TP, ``SharedExpertMLP``), and, in
    the ETP group (``etp`` consecutive ranks), the all-gather of the ``rows`` dispatched
    copies after the EP all-to-all and the reduce-scatter of the experts' output before
    the combine, their gradients' reduce-scatter and all-gather in the backward.

    The bytes: the all-gather carries the dispatched tokens (16-bit, ``ACT_BYTES``), the
    reduce-scatter the experts' outputs cast to the routing probabilities' dtype first
    (``combine_preprocess``: ``reduce_scatter_to_sequence_parallel_region(hidden_states.
    to(self.probs.dtype), ...).to(hidden_states.dtype)``, core 0.16.1
    ``transformer/moe/token_dispatcher.py``), which is the router's: the input's (bf16)
    by default, fp32 with ``--moe-router-dtype fp32`` (``router.py``: ``router_dtype``).
    The planner keeps the probabilities in fp32 (their activations, ``4 T E``, and the
    softmax are priced in fp32; Megatron-Core advises fp32 routing from 32 experts), and
    its Megatron paste writes ``--moe-router-dtype fp32``: so the reduce-scatter moves
    :data:`PROBS_BYTES` a value, and in the backward its gradient's all-gather too (the
    cast's backward brings the gradient to fp32 before it), while the dispatch's gradient
    reduce-scatter stays 16-bit. (The probabilities themselves also travel, one value a
    copy beside ``h`` of the token: not priced.)

    The routed pair is never hidden (under every ``--tp-overlap``): the dispatcher's
    collectives are autograd functions of their own, run after the grouped GEMMs'
    backward (data and weight gradients together), and TransformerEngine's userbuffers
    (``--tp-comm-overlap``) are off for the experts (Megatron-Core 0.16.1
    ``extensions/transformer_engine.py``: ``TELinear`` "Disable ub overlap for experts";
    ``TEGroupedLinear`` hands TE no TP group, "the comms between TP and EP group is
    explicitly handled by MoE token dispatcher"), nor does the grouped GEMM's weight
    gradient re-gather its input (it keeps the gathered copies). ``hide``, ``hide_dgrad``:
    the QKV and shared up-projection's weight- and data-gradient seconds
    (:func:`~pipebubble.plan.tensor.sp_collective`). At ``etp = tp`` the block is priced
    by :func:`~pipebubble.plan.tensor.block_tp_comm` (one MLP pair on the TP group's
    tokens, torchtitan's layout; under Megatron-Core's framework at ``etp = tp`` too,
    :attr:`MoERecipe.megatron_dispatch`).

    With ``net.tp_comm_overlap`` (``--tp-overlap on``: Megatron-LM's ``--tp-comm-overlap``)
    the attention's and the shared experts' pairs are pipelined with their GEMMs
    (:func:`pipelined_pair`; ``fwd_gemms``: QKV, O, then the shared fc1 and fc2 forward
    seconds, ``dgrad_rows``: O's and fc2's data gradients): Megatron-Core builds QKV, O
    and ``SharedExpertMLP``'s fc1 and fc2 (an ``MLP`` with ``is_expert`` False,
    ``transformer/moe/shared_experts.py``, ``transformer/mlp.py``) as TransformerEngine
    linears with the ``qkv``, ``proj``, ``fc1``, ``fc2`` userbuffers; the routed pair stays
    exposed (above)."""
    pipe = net.tp_comm_overlap and len(fwd_gemms) == 2 * (1 + shared) and len(
        dgrad_rows) == 1 + shared
    if pipe:
        parts = [pipelined_pair(tokens, hidden, tp, net, hide[j], hide_dgrad[j],
                                fwd_gemms[2 * j:2 * j + 2], dgrad_rows[j])
                 for j in range(1 + shared)]
    else:
        parts = [sp_collective(tokens, hidden, tp, net, hide[0], hide_dgrad[0])]
        if shared:
            parts.append(sp_collective(tokens, hidden, tp, net, hide[1], hide_dgrad[1]))
    f, b, hid = (sum(p[i] for p in parts) for i in range(3))
    pair = etp_pair_time(rows, hidden, etp, net)
    return f + pair, b + pair, hid


def etp_pair_time(rows: float, hidden: int, etp: int, net: Network) -> float:
    """Seconds of the routed experts' ETP pair of one block, each way (forward: the
    tokens' all-gather after the dispatch and the outputs' reduce-scatter before the
    combine; backward: their gradients' reduce-scatter and all-gather) over ``etp``
    consecutive ranks, ``rows`` gathered copies of ``hidden`` values: the tokens in 16-bit,
    the outputs in the routing probabilities' dtype (:func:`etp_block_comm`); 0 at etp 1."""
    if etp <= 1:
        return 0.0
    link = net.link(1, etp)
    n = rows * hidden
    return all_gather(ACT_BYTES * n, etp, link) + reduce_scatter(PROBS_BYTES * n, etp, link)


# ---- the request's checks ------------------------------------------------------------------
def check_imbalance(value: float | None) -> float | None:
    """``--moe-imbalance``: None (the default) or a finite number >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value >= 1):
        raise UserError(f"{param('moe_imbalance')} must be a finite number >= 1 (the busiest "
                         f"expert rank's tokens over the mean; 1: even routing), got {value!r}")
    return float(value)


def default_imbalance(shape: MoEShape) -> float:
    """The router's capacity factor when the shape names one, else 1.0 (module doc).

    Not a measured figure: none was found for the busiest EP rank of these models.
    Megatron-Core's MoE guide (``megatron/core/transformer/moe/README.md``) lists the
    balancing options and ``--moe-expert-capacity-factor`` without a measured imbalance;
    Wang et al., "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"
    (arXiv 2408.15664, the bias DeepSeek-V3 balances with) measure MaxVio, the heaviest
    expert's load over the mean minus 1 (``u - 1`` with one expert a rank; a rank holding
    several averages them, so its ``u`` is at most that), on 1B and 3B models; its figures
    were not at hand to quote."""
    cf = shape.extra.get("capacity_factor") if isinstance(shape.extra, dict) else None
    return float(cf) if isinstance(cf, int | float) and cf >= 1 else DEFAULT_IMBALANCE


def moe_shape_of(profiles) -> MoEShape | None:
    """The :class:`MoEShape` of an analytic MoE profile (``metadata["moe"]``), None for any
    other profile."""
    meta = profiles.metadata()
    d = meta.get("moe")
    if meta.get("source") != "analytic" or not isinstance(d, dict):
        return None
    d = dict(d)
    d["dense_layers"] = tuple(d.get("dense_layers") or ())
    if isinstance(d.get("mla"), dict):
        d["mla"] = LatentAttention(**d["mla"])
    try:
        shape = MoEShape(**d)
    except TypeError as exc:
        raise UserError(f"the profile's 'moe' entry is not an MoE shape ({marked(exc)})") from None
    if len(profiles) != shape.layers + 2:
        return None
    return shape


def ep_options(req, shape: MoEShape | None, hardware: bool) -> tuple[int, ...]:
    """The EP degrees to search: ``--ep`` (``ep=`` of ``--config``) checked against the
    model's experts and the GPUs, else every power of two dividing the experts and the GPUs
    (1 for a dense model). One line for ``--ep`` on a dense profile."""
    given = getattr(req, "ep", None)
    flag = (f"{param('config')} ep=" if "ep" in getattr(req, "config", ()) else
            f"{param('ep')} ") + ",".join(map(str, given or ()))
    if shape is None:
        if given and tuple(given) != (1,):
            why = "needs" if hardware else f"needs {param('hardware')} and"
            raise UserError(f"{flag} {why} an MoE profile (an analytic profile of the HF config of "
                             "a mixtral, qwen2_moe, qwen3_moe or deepseek_v3 model); this "
                             "profile has no experts")
        return (1,)
    E = shape.experts
    if given:
        for ep in given:
            if E % ep:
                valid = ", ".join(str(d) for d in range(1, E + 1) if E % d == 0)
                raise UserError(f"{flag}: ep {ep} must divide the model's {E} experts (each "
                                 f"EP rank holds experts / ep of them); valid are {valid}")
        if not any(req.gpus % ep == 0 for ep in given):
            raise UserError(f"{flag} must divide dp x cp (expert parallelism is carved out of "
                             f"the data x context parallel ranks), but no ep given divides "
                             f"{param('gpus')} {req.gpus}")
        return tuple(given)
    out, d = [], 1
    while d <= E and req.gpus % d == 0 and E % d == 0:
        out.append(d)
        d *= 2
    return tuple(out)


def check_ep_splits(req, ep_list, splits, shardings=(), gpus_per_node: int = 8,
                    etp_list: tuple[int, ...] | None = None) -> None:
    """One line unless some ``(tp, cp, pp, dp)`` split and sharding leave room for a given
    ep (only when ``--ep`` or ``ep=`` is given): ``tp x cp x dp / etp`` (``dp x cp`` at
    ``etp = tp``) under Megatron-Core's folding (``req.ep_from`` ``"dp"``, the default:
    every data-parallel rank, replicated or sharded), ``dp_shard`` in place of ``dp``
    under torchtitan's (``"dp_shard"``: ddp shards nothing, so there ep must divide cp,
    ``tp / etp x cp``), and HSDP's shard group under either rule when every sharding asked
    for is hsdp (:attr:`~pipebubble.plan.dims.ParallelDims.hybrid`)."""
    given = getattr(req, "ep", None)
    if not given:
        return
    ep_from = getattr(req, "ep_from", "dp")
    flag = (f"{param('config')} ep=" if "ep" in getattr(req, "config", ()) else
            f"{param('ep')} ") + ",".join(map(str, given))
    def room(tp: int, cp: int, data: int) -> set[int]:  # tp x data x cp / etp
        d = ParallelDims(tp=tp, cp=cp)
        return {r for e in (etp_list or (tp,)) if (r := d.ep_room(data, e))} or {
            data * cp}

    rooms = sorted({r for tp, cp, _, dp in splits for r in room(tp, cp, dp)})
    lent = " and the TP ranks ETP leaves, tp / etp" if etp_list else ""
    if not any(room % ep == 0 for room in rooms for ep in ep_list):
        raise UserError(f"{flag} must divide dp x cp (expert parallelism is carved out of the "
                         f"data x context parallel ranks{lent}); these degrees leave "
                         f"{'tp x dp x cp / etp' if etp_list else 'dp x cp'} in "
                         f"{', '.join(map(str, rooms))}")
    if ep_from == "dp" and not all(s.hybrid for s in shardings):
        return  # every split's data-parallel ranks are EP's, whatever the sharding
    shard_rooms = set()
    for tp, cp, _, dp in splits:
        mp = ParallelDims(tp=tp, cp=cp).model_parallel
        for s in shardings:
            replicate, shard = s.split_dp(dp, mp, gpus_per_node)
            if s.hybrid and min(replicate, shard) == 1:
                continue  # no shard group at this dp: hsdp is not searched there
            shard_rooms.update(room(tp, cp, shard))
    if shardings and all(s.hybrid for s in shardings):
        if shard_rooms and not any(room % ep == 0 for room in shard_rooms for ep in ep_list):
            valid = sorted({d for r in shard_rooms for d in range(1, r + 1) if r % d == 0})
            raise UserError(f"{flag} must divide HSDP's shard group, tp / etp x dp_shard x cp "
                            f"(torchtitan's mesh pp x dp_replicate x efsdp x ep carves EP "
                            f"out of it, never out of dp_replicate), but these degrees leave "
                            f"it in {', '.join(map(str, sorted(shard_rooms)))}; valid ep are "
                            f"{', '.join(map(str, valid))}")
        return
    if shardings and not any(room % ep == 0 for room in shard_rooms for ep in ep_list):
        names = ", ".join(str(s) for s in shardings)
        in_config = "sharding" in getattr(req, "config", ())
        def as_given(value: str) -> str:  # a --config key, or the flag, as the user gave it
            return (f"{param('config')} sharding={value}" if in_config
                    else f"{param('shardings')} {value}")
        given_as, fix = as_given(names), as_given("fsdp")
        raise UserError(f"{flag} must divide dp_shard x cp (torchtitan's EP borrows the "
                         f"sharded data-parallel ranks only), but {given_as} leaves "
                         f"dp_shard x cp in {', '.join(map(str, sorted(shard_rooms)))} "
                         f"(ddp shards nothing: dp_shard 1); use {fix}, or a cp that ep "
                         "divides, or a framework that runs EP over replicated ranks "
                         f"({param('framework')} megatron)")


# ---- one point's layer costs -----------------------------------------------------------------
class ExpertCosts(ParallelCosts):
    """The layers (embedding, blocks, head) of an :class:`MoEShape` at one point of (tp, sp,
    cp, ep) on ``rates`` and ``net`` (module doc); answers :meth:`at` as
    :class:`~pipebubble.plan.parallel_costs.ParallelCosts` does, with the ``expert``,
    ``a2a_f`` and ``a2a_b`` columns."""

    def __init__(self, shape: MoEShape, seq: int, rates: Rates, net: Network, tp: int = 1,
                 sp: bool = False, cp: int = 1, ep: int = 1, flash: bool = True,
                 imbalance: float = DEFAULT_IMBALANCE, names=None, modules=None,
                 profile=None, recipe: MoERecipe = NO_RECIPE, etp: int | None = None):
        self.recipe = recipe
        if recipe.fp8_gemm_ratio != 1 and rates.fp8_flops > 0:
            rates = replace(rates, fp8_flops=rates.fp8_flops * recipe.fp8_gemm_ratio)
        self.shape, self.seq, self.rates, self.net = shape, seq, rates, net
        self.tp, self.sp, self.cp, self.ep, self.flash = tp, sp, cp, ep, flash
        # an etp other than tp needs SP (at tp > 1) and must split the experts' columns; an
        # ETP group serves 1 / (tp / etp) of its TP group's tokens (ParallelDims.etp_groups)
        e = tp if etp is None else etp
        if isinstance(e, bool) or not isinstance(e, int) or e < 1:
            raise UserError(f"etp must be an integer >= 1, got {e!r}")
        check_etp_sp(tp, sp and tp > 1, e)
        check_etp_shape(shape, e)
        self.etp, self.etp_groups = e, etp_groups(tp, e)
        # Megatron-Core's dispatcher (each rank its own sequence shard, copies gathered over
        # ETP) at every etp but tp, and at etp = tp under its framework (MoERecipe)
        self.gathered = e != tp or (recipe.megatron_dispatch and sp and tp > 1)
        self.imbalance = imbalance
        L = shape.layers
        self.names = names or ["tok_embeddings", *(f"layers.{i}" for i in range(L)), "output"]
        self.modules = modules or [[n] for n in self.names]
        self.profile = profile
        h, V = shape.hidden, shape.vocab
        emb = V * h / tp
        head = h + (0.0 if shape.tied_embeddings else V * h / tp)
        blocks, experts = [], []
        for n in range(L):
            routed = (shape.experts * shape.expert_params() / self.etp / ep if shape.is_moe(n)
                      else 0.0)
            split = shape.attention_matmul_params() + (
                shape.shared_params() if shape.is_moe(n) else 3 * h * shape.dense_ffn)
            kept = (shape.attention_other_params() + 2 * h
                    + (shape.router_params() if shape.is_moe(n) else 0))
            blocks.append(split / tp + kept + routed)
            experts.append(routed)
        # the MTP modules (recipe.mtp_layers) on the head's stage: an MoE block each (the
        # last block's parameters), its 2h x h projection and two more norms
        mtp = recipe.mtp_layers
        moe_last = max((n for n in range(L) if shape.is_moe(n)), default=L - 1)
        head += mtp * (blocks[moe_last] + 2 * h * h / tp + 2 * h)
        self.params = np.array([emb, *blocks, head], dtype=np.float64)
        self.experts = np.array([0.0, *experts, mtp * experts[moe_last]], dtype=np.float64)
        # the head's stage needs the embedding too with a tied head or an MTP module (which
        # embeds the shifted tokens with the main model's table): a copy where the head's
        # rank holds none (plan/cut_price.embedding_copies), one for both uses
        self.tied = V * h / tp if shape.tied_embeddings or mtp else 0.0
        self._cache: dict[tuple[int, str], LayerCosts] = {}
        self._blocks: dict[tuple[bool, int], dict] = {}

    # -- one block --
    def _attention(self, T: float) -> tuple[list, float, float, float]:
        """(GEMMs, the attention's local width for FlashAttention, its head dim, the K/V
        width CP's ring moves) of one block's attention."""
        sh, t, h, a = self.shape, self.tp, self.shape.hidden, self.shape.heads
        m = sh.mla
        if m is None:
            q, kv = a * sh.head_dim, sh.kv * sh.head_dim
            return ([(T, (q + 2 * kv) / t, h), (T, h, q / t)], q / t, sh.head_dim, kv / t)
        dqk = m.nope_dim + m.rope_dim
        q = [(T, m.q_rank, h), (T, a * dqk / t, m.q_rank)] if m.q_rank else [
            (T, a * dqk / t, h)]
        gemms = [*q, (T, m.kv_rank + m.rope_dim, h), (T, a * (m.nope_dim + m.v_dim) / t,
                                                       m.kv_rank), (T, h, a * m.v_dim / t)]
        return gemms, a * (dqk + m.v_dim) / 2 / t, dqk, a * (dqk + m.v_dim) / 2 / t

    def block_of(self, moe: bool, b: int) -> dict[str, float]:
        """Seconds of one block's F, I, W (a dense or an MoE block), the all-to-all part of
        F (``a2a``, the same in the backward), the selective recompute and TP's hidden part;
        ``expert_flops``: the routed experts' forward GEMM FLOPs on this rank."""
        key = (moe, b)
        if key in self._blocks:
            return self._blocks[key]
        sh, r, t, cp, ep, u = self.shape, self.rates, self.tp, self.cp, self.ep, self.imbalance
        e, g = self.etp, self.etp_groups
        T = self.seq * b / cp
        h = sh.hidden
        attn_gemms, width, head_dim, kv_width = self._attention(T)
        if moe:
            fs = sh.shared_experts * sh.shared_ffn
            shared = [(T, 2 * fs / t, h), (T, h, fs / t)] if fs else []
            # the ETP group's dispatched copies: its 1/g of the TP group's T tokens, top k
            routed_rows = T * sh.top_k * u / g
            local = sh.experts // ep
            rows = routed_rows / local  # per local expert
            experts = [(rows, 2 * sh.expert_ffn / e, h), (rows, h, sh.expert_ffn / e)]
            mlp = shared + experts
            inner = (fs + routed_rows / T * sh.expert_ffn * g) / t  # SwiGLU width per token
            router = [(T, sh.experts, h)]
        else:
            mlp = [(T, 2 * sh.dense_ffn / t, h), (T, h, sh.dense_ffn / t)]
            inner, router, routed_rows, local = sh.dense_ffn / t, [], 0.0, 1
        gemms = attn_gemms + mlp
        # the last two GEMMs of an MoE block run once per local expert (all alike)
        times = [local if moe and j >= len(gemms) - 2 else 1 for j in range(len(gemms))]
        each = list(zip(times, gemms, strict=True))
        fwds = [x * gemm_time(m, n, k, r, fp8=True) for x, (m, n, k) in each]
        fwd = sum(fwds) + sum(gemm_time(m, n, k, r) for m, n, k in router)
        dgrads = [x * gemm_time(m, k, n, r, fp8=True) for x, (m, n, k) in each]
        wgrads = [x * gemm_time(k, n, m, r, fp8=True) for x, (m, n, k) in each]
        dgrad = sum(dgrads) + sum(gemm_time(m, k, n, r) for m, n, k in router)
        wgrad = sum(wgrads) + sum(gemm_time(k, n, m, r) for m, n, k in router)
        attn = attention_time(T, self.seq, width, r, flash=self.flash, sequences=b,
                              head_dim=head_dim)
        attn_b = attention_backward_time(attn, self.flash)
        rows_sp = T / (t if self.sp else 1)
        elementwise = (2 * 4 + 2 * 6) * rows_sp * h + 4 * T * kv_width + 6 * T * inner
        if moe:  # router softmax / top-k (fp32), permute and unpermute the dispatched tokens
            elementwise += 12 * T * sh.experts + 8 * ACT_BYTES * routed_rows * h
        rc = self.recipe
        eight = r.fp8_flops > 0
        casts_f = casts_i = casts_w = 0.0
        if rc.block_scaling and eight:  # the quantization round trips (MoERecipe)
            ins, outs, acts = self._fp8_tensors(moe, T, routed_rows)
            casts_f = memory_time((ACT_BYTES + FP8_WIRE_BYTES) * ins, r)
            casts_i = memory_time((ACT_BYTES + 2 * FP8_WIRE_BYTES) * outs, r)
            casts_w = memory_time((1 + FP8_WIRE_BYTES) * acts, r)
        redo = 0.0
        if rc.recompute_latent:  # the MLA up-projections and the norms, again in the backward
            ups = attn_gemms[1:2] + attn_gemms[3:4] if sh.mla is not None and sh.mla.q_rank \
                else (attn_gemms[2:3] if sh.mla is not None else [])
            redo = sum(gemm_time(m, n, k, r, fp8=True) for m, n, k in ups) + memory_time(
                2 * 4 * rows_sp * h + (2 * 2 * T * (sh.mla.q_rank + sh.mla.kv_rank)
                                       if sh.mla is not None else 0), r)
        mem = memory_time(elementwise, r)
        hide = (wgrads[0], wgrads[len(attn_gemms)])
        dhide = (dgrads[0], dgrads[len(attn_gemms)])
        na = len(attn_gemms)  # QKV (the first) and O (the last) of the attention
        if moe and self.gathered:  # Megatron-Core's dispatcher: the copies gathered over ETP
            cols = (fwds[0], fwds[na - 1]) + ((fwds[na], fwds[na + 1]) if fs else ())
            drows = (dgrads[na - 1],) + ((dgrads[na + 1],) if fs else ())
            tp_f, tp_b, tp_hidden = etp_block_comm(T, h, t, e, self.net, hide, dhide,
                                                   bool(fs), routed_rows, cols, drows)
        elif moe and self.sp and t > 1 and self.net.tp_comm_overlap:
            tp_f, tp_b, tp_hidden = replicated_block_comm(
                T, h, t, self.net, hide, dhide, (fwds[0], fwds[na - 1]), dgrads[na - 1])
        else:  # a dense block (DeepSeek's first ones) pipelines as ParallelCosts' does
            pipe = {} if moe else {"fwd_gemms": (fwds[0], fwds[na - 1], fwds[na],
                                                 fwds[na + 1]),
                                   "dgrad_rows": (dgrads[na - 1], dgrads[na + 1])}
            tp_f, tp_b = block_tp_comm(T, h, t, self.net, self.sp, hide=hide,
                                       hide_dgrad=dhide, **pipe)
            tp_hidden = block_tp_hidden(T, h, t, self.net, self.sp, hide=hide,
                                        hide_dgrad=dhide)
        cp_f, cp_b = block_cp_comm(T, kv_width, cp, t, self.net, (attn, attn_b))
        members = self.net.members_per_node(e, ep)  # the EP group: ep ranks etp apart
        shares = routed_shares(sh, ep, members)
        # dispatch and combine (their gradients in the backward: the combine's gradient goes
        # the dispatch's way); with recipe.fp8_dispatch one of each pair in FP8; at a
        # measured kernel's rates (recipe.a2a_measured) under group-limited routing
        wire = FP8_WIRE_BYTES if rc.fp8_dispatch else ACT_BYTES
        rates = rc.a2a_rates(ep) if shares is not None else None
        if rates is not None:
            shares = routed_shares(sh, ep, members, own_node=True)
        d_rate, c_rate = rates or (0.0, 0.0)
        # each rank sends its own tokens' copies (etp != tp: Megatron-Core's dispatcher,
        # 1 / etp of the gathered rows), or, at etp = tp, its TP group's (torchtitan's)
        sent = routed_rows / e if self.gathered else routed_rows
        a2a = (all_to_all_time(wire * sent * h, ep, e, self.net, shares, d_rate)
               + all_to_all_time(ACT_BYTES * sent * h, ep, e, self.net, shares, c_rate)
               ) if moe else 0.0
        # the ETP pair (Megatron-Core's dispatcher, inside tp_f / tp_b): communication
        # between the dispatch and the experts, and the experts and the combine
        etp_comm = etp_pair_time(routed_rows, h, e, self.net) if moe and self.gathered \
            else 0.0
        got = self._blocks[key] = {
            "f": fwd + attn + mem + tp_f + cp_f + a2a + casts_f,
            "i": dgrad + attn_b + 2 * mem + tp_b + cp_b + a2a + casts_i + redo,
            "w": wgrad + casts_w, "a2a": a2a, "etp": etp_comm,
            "selective": attn + cp_f, "hidden": tp_hidden,
            "casts": casts_f + casts_i + casts_w, "recomputed": redo,
            "expert_flops": sum(2 * local * m * n * k for m, n, k in experts) if moe else 0.0,
            "gemm_f": fwd, "attention_f": attn, "elementwise_f": mem}
        return got

    def _fp8_tensors(self, moe: bool, T: float, routed_rows: float
                     ) -> tuple[float, float, float]:
        """(values quantized before the forward's FP8 GEMMs, output-gradient values the
        backward quantizes, stored FP8 activation values the weight gradients transpose) of
        one block on this rank (``MoERecipe.block_scaling``): each distinct GEMM input once
        (Q and KV down share the norm's output; the shared and routed experts the MoE input,
        cast once before the dispatch), the routed tensors per dispatched copy."""
        sh, t, h = self.shape, self.tp, self.shape.hidden
        m, a = sh.mla, sh.heads
        if m is None:
            q, kv = a * sh.head_dim, sh.kv * sh.head_dim
            attn_in, attn_out, attn_acts = h + q / t, (q + 2 * kv) / t + h, h + q / t
        else:
            dqk = m.nope_dim + m.rope_dim
            lat = (m.q_rank + m.kv_rank) if m.q_rank else m.kv_rank
            attn_in = h + lat + a * m.v_dim / t
            attn_out = ((m.q_rank + a * dqk / t) if m.q_rank else a * dqk / t) + (
                m.kv_rank + m.rope_dim) + a * (m.nope_dim + m.v_dim) / t + h
            attn_acts = (2 * h if m.q_rank else h) + lat + a * m.v_dim / t
        if moe:
            fs = sh.shared_experts * sh.shared_ffn / t
            k = routed_rows / T  # dispatched copies a token, on this rank
            fe = sh.expert_ffn / self.etp
            mlp_in = h + fs + k * fe
            mlp_out = (3 * fs + h if fs else 0.0) + k * (2 * fe + h)
            mlp_acts = (h + fs if fs else 0.0) + k * (h + fe)
        else:
            fd = sh.dense_ffn / t
            mlp_in, mlp_out, mlp_acts = h + fd, 2 * fd + h, h + fd
        return (T * (attn_in + mlp_in), T * (attn_out + mlp_out), T * (attn_acts + mlp_acts))

    def _activations(self, n: int, b: int, recompute: str) -> tuple[float, float, float]:
        """(kept by F under ``recompute``, of it what W needs, kept without recomputation)
        bytes of block ``n`` on this rank: :func:`~pipebubble.plan.moe.layer_cost`'s count
        with the norm, attention and MLP inputs replicated over TP (split with SP), the rest
        split over TP, every token tensor over CP, the dispatched tokens times the
        imbalance."""
        key = ("act", self.shape.is_moe(n), b, recompute)
        got = self._blocks.get(key)
        if got is not None:
            return got
        sh, s, t, cp = self.shape, self.seq, self.tp, self.cp
        c = layer_cost(sh, n, s, b, ACT_BYTES, self.flash)
        tokens = s * b
        repl = 8 * tokens * sh.hidden
        routed = c.dispatched_tokens * (4 * sh.hidden + 6 * sh.expert_ffn)
        rest = c.activation_bytes - repl - routed
        # Megatron-Core's dispatcher: each ETP rank keeps the copies gathered over its ETP
        # group as the up-projection's input, etp x its own (2 h bytes a copy). torchtitan's
        # layout at etp = tp > 1: the MoE input is replicated over TP (Shard(1) ->
        # Replicate), so every TP rank dispatches all T k copies and keeps their inputs and
        # the experts' (partial) outputs the combine weighs, tp x its share of each
        moe = sh.is_moe(n)
        replicated = moe and not self.gathered and t > 1
        g = self.etp if moe and (self.gathered or replicated) else 1
        extra = c.dispatched_tokens * 2 * sh.hidden * (g - 1)  # the up-projection inputs
        routed += 2 * extra if replicated else extra
        saved, redo = self.recipe_activation_savings(moe, tokens, g, g if replicated else 1)
        repl, rest, routed = repl - saved[0], rest - saved[1], routed - saved[2]
        split = lambda r, x, y: (r / (t if self.sp else 1) + (x + y * self.imbalance) / t  # noqa: E731
                                 ) / cp
        none = split(repl, rest, routed)
        w = min((c.weight_activation_bytes + extra) / t / cp, none)
        if recompute == "full":
            kept = 2 * tokens * sh.hidden / cp / (t if self.sp else 1)
        else:  # FlashAttention keeps no scores: selective keeps what none keeps
            kept = none
        # what the backward re-runs lives while the block's backward runs (the transient)
        live = max(none + split(*redo), kept)
        got = self._blocks[key] = (kept, min(w, kept), live)
        return got

    def recipe_activation_savings(self, moe: bool, tokens: float, gathered: int = 1,
                                  outputs: int = 1) -> tuple[tuple[float, float, float],
                                             tuple[float, float, float]]:
        """Bytes of one block's activations (``tokens`` tokens, before TP, SP and CP
        split them) the recipe does not keep, as (replicated, split, per dispatched copy)
        parts of :meth:`_activations`' count, and of them what the backward re-computes
        (:class:`MoERecipe`'s ``recompute_latent``, ``fp8_activations`` and
        ``weighted_swiglu``); ``gathered``: the up-projection inputs a rank keeps per
        dispatched copy of its own (its ETP group's, at an etp other than tp; its TP
        group's in torchtitan's layout at etp = tp); ``outputs``: the experts' outputs it
        keeps per copy of its own (its TP group's in torchtitan's layout at etp = tp)."""
        rc, sh, T = self.recipe, self.shape, tokens
        h, m = sh.hidden, sh.mla
        repl = split = routed = 0.0
        r_repl = r_split = r_routed = 0.0
        if rc.recompute_latent:  # the normed block inputs, normed latents and Q, K, V
            repl = r_repl = 4 * T * h
            if m is not None:
                qk, v = sh.heads * (m.nope_dim + m.rope_dim), sh.heads * m.v_dim
                split = r_split = 2 * T * (m.q_rank + m.kv_rank) + 2 * T * (2 * qk + v)
        if rc.fp8_activations:
            o_in = sh.heads * (m.v_dim if m is not None else sh.head_dim)
            split += (ACT_BYTES - E5M6_BYTES) * T * o_in  # the output projection's input
            if moe:  # gate and up in FP8, their product re-computed; the tokens in FP8
                fs = sh.shared_experts * sh.shared_ffn
                split += (6 - 2 * FP8_WIRE_BYTES) * T * fs
                r_split += 2 * T * fs
                routed = (ACT_BYTES - FP8_WIRE_BYTES) * h * gathered + (
                    6 - 2 * FP8_WIRE_BYTES) * sh.expert_ffn
                r_routed = 2 * sh.expert_ffn
            else:  # the down-projection's input in FP8
                split += (ACT_BYTES - FP8_WIRE_BYTES) * T * sh.dense_ffn
        if rc.weighted_swiglu and moe:  # no expert output kept for the combine's backward
            routed += ACT_BYTES * h * outputs
        d = T * sh.top_k if moe else 0.0  # dispatched copies
        return (repl, split, routed * d), (r_repl, r_split, r_routed * d)

    def recompute_modes(self) -> tuple[str, ...]:
        """The modes MoE layers are priced for: torchtitan's op-level checkpointing (op)
        is priced for dense blocks only."""
        return tuple(m for m in MODES if m != "op")

    def at(self, size: int, recompute: str = "none") -> LayerCosts:
        key = (size, recompute)
        got = self._cache.get(key)
        if got is not None:
            return got
        if recompute not in self.recompute_modes():
            raise UserError(f"unknown recompute mode {recompute!r} for MoE layers; valid are "
                             f"{', '.join(self.recompute_modes())}")
        sh, s, b, t, cp = self.shape, self.seq, size, self.tp, self.cp
        emb, head = self.ends(b)
        cols: dict[str, list[float]] = {k: [] for k in (
            "f", "i", "w", "act", "act_w", "transient", "hidden", "a2a_f", "a2a_b")}
        for n in range(sh.layers):
            blk = self.block_of(sh.is_moe(n), b)
            kept, w, none = self._activations(n, b, recompute)
            extra = {"none": 0.0, "selective": blk["selective"], "full": blk["f"]}[recompute]
            cols["f"].append(blk["f"])
            cols["i"].append(blk["i"] + extra)
            cols["w"].append(blk["w"] + memory_time(self.rates.grad_accumulation
                                                    * self.params[n + 1], self.rates))
            cols["act"].append(kept)
            cols["act_w"].append(w)
            cols["transient"].append(none - kept)
            cols["hidden"].append(blk["hidden"])
            comm = blk["a2a"] + blk["etp"]  # what a DualPipe pair may hide (module doc)
            cols["a2a_f"].append(comm)
            cols["a2a_b"].append(comm * (2 if recompute == "full" else 1))
        acc = [memory_time(self.rates.grad_accumulation * P, self.rates)
               for P in (self.params[0], self.params[-1])]
        a_head = head_activation_bytes(sh, s, b, t, self.sp, cp)
        a2a_head = [0.0, 0.0]
        mtp = self.recipe.mtp_layers
        if mtp:  # each MTP module: an MoE block, its projection and the head again
            n_m = max((n for n in range(sh.layers) if sh.is_moe(n)), default=sh.layers - 1)
            blk = self.block_of(sh.is_moe(n_m), b)
            kept, _, _ = self._activations(n_m, b, recompute)
            T = s * b / cp
            proj = gemm_time(T, sh.hidden, 2 * sh.hidden, self.rates, fp8=True)
            proj_b = (gemm_time(T, 2 * sh.hidden, sh.hidden, self.rates, fp8=True),
                      gemm_time(2 * sh.hidden, sh.hidden, T, self.rates, fp8=True))
            extra_f = {"none": 0.0, "selective": blk["selective"], "full": blk["f"]}[recompute]
            head = {"f": head["f"] + mtp * (blk["f"] + proj + head["f"]),
                    "i": head["i"] + mtp * (blk["i"] + extra_f + proj_b[0] + head["i"]),
                    "w": head["w"] + mtp * (blk["w"] + proj_b[1] + head["w"])}
            a_head = a_head * (1 + mtp) + mtp * (kept + 4 * T * sh.hidden)
            comm = blk["a2a"] + blk["etp"]
            a2a_head = [mtp * comm, mtp * comm * (2 if recompute == "full" else 1)]
        out = 2 * s * b / cp * sh.hidden / t
        col = lambda e, xs, hd: np.array([e, *xs, hd], dtype=np.float64)  # noqa: E731
        lc = LayerCosts(
            f=col(emb["f"], cols["f"], head["f"]),
            i=col(emb["i"], cols["i"], head["i"]),
            w=col(emb["w"] + acc[0], cols["w"], head["w"] + acc[1]),
            act=col(embedding_activation_bytes(s, b, cp), cols["act"], a_head),
            act_w=col(0.0, cols["act_w"], min(a_head, 2 * s * b / cp * sh.hidden)),
            out=col(out, [out] * sh.layers, 0.0), params=self.params,
            transient=col(0.0, cols["transient"], 0.0), tied=self.tied,
            hidden=col(0.0, cols["hidden"], 0.0), expert=self.experts,
            a2a_f=col(0.0, cols["a2a_f"], a2a_head[0]),
            a2a_b=col(0.0, cols["a2a_b"], a2a_head[1]), comm_sms=self.recipe.comm_sms)
        self._cache[key] = lc
        return lc


def point_costs(shape, seq: int, rates: Rates, net: Network, tp: int, sp: bool, cp: int,
                flash: bool, profiles, ep_list: tuple[int, ...], imbalance: float | None,
                recipe: MoERecipe | None = None, etp_list: tuple[int, ...] | None = None,
                etp_given: bool = False) -> list[tuple[int, int, object]]:
    """``(ep, etp, layer costs)`` at one (tp, sp, cp): a dense shape's
    :class:`~pipebubble.plan.parallel_costs.ParallelCosts` (ep 1, etp tp), an MoE shape's
    :class:`ExpertCosts` at every ep of ``ep_list`` and etp of ``etp_list`` this point
    allows (:func:`etp_options`; None: ``tp`` alone; ``etp_given``: the list is the
    user's)."""
    kw = dict(names=profiles.names, modules=profiles.modules, profile=profiles.profile)
    if not isinstance(shape, MoEShape):
        return [(1, tp, ParallelCosts(shape, seq, rates, net, tp, sp, cp, flash, **kw))]
    u = imbalance if imbalance is not None else default_imbalance(shape)
    rc = recipe or NO_RECIPE
    etps = (tp,) if etp_list is None else etp_options(etp_list, tp, sp, etp_given)
    return [(ep, e, ExpertCosts(shape, seq, rates, net, tp, sp, cp, ep, flash, u, **kw,
                                recipe=rc, etp=e)) for ep in ep_list for e in etps]


def etp_options(etp_list: tuple[int, ...], tp: int, sp: bool, given: bool = False
                ) -> tuple[int, ...]:
    """The etp of ``etp_list`` one (tp, sp) point allows. The search's own list (``given``
    False): those dividing ``tp``, below it only with SP. A given list: every etp equal to
    ``tp``, or other with SP or at tp 1 (:func:`~pipebubble.plan.dims.check_etp_sp`;
    whether the stage's ranks hold it is the split's question, ``ParallelDims.ep_fits``).

    >>> etp_options((1, 8), tp=8, sp=True), etp_options((1, 8), tp=8, sp=False)
    ((1, 8), (8,))
    >>> etp_options((1, 2, 16), tp=2, sp=True, given=True), etp_options((4,), 1, False, True)
    ((1, 2, 16), (4,))
    """
    if not given:
        return tuple(e for e in sorted(set(etp_list)) if tp % e == 0 and (e == tp or sp))
    return tuple(e for e in sorted(set(etp_list)) if e == tp or sp or tp == 1)


def check_etp_shape(shape: MoEShape, etp: int, flag: str = "etp") -> None:
    """One line unless ``etp`` divides the experts' inner size (each ETP rank holds ``f_e
    / etp`` of every expert's columns; Megatron-Core's grouped linears divide it)."""
    f = shape.expert_ffn
    if f % etp:
        valid = ", ".join(str(d) for d in range(1, min(f, 64) + 1) if f % d == 0)
        raise UserError(f"{flag} {etp} must divide the model's expert inner size {f} (each "
                        f"expert-tensor-parallel rank holds f_e / etp of each expert's "
                        f"columns); valid include {valid}")


def etp_search(req, shape: MoEShape | None, tps: tuple[int, ...],
               stages: tuple[int, ...] = ()) -> tuple[int, ...] | None:
    """``--etp`` (``etp=`` of ``--config``) checked against the model and the degrees
    searched, else the divisors of each point's tp among 1 and the tp searched (1: experts
    whole, and tp: the TP split, the layouts Megatron-Core and torchtitan both run; None
    here for a dense profile). One line for ``--etp`` on a dense profile, an etp that does
    not divide the experts' inner size, or one that divides no stage's ``tp x cp x dp``
    of the splits (``stages``: Megatron-Core's expert mesh ``etp x ep x edp`` is the
    stage's ranks)."""
    given = getattr(req, "etp", None)
    flag = (f"{param('config')} etp=" if "etp" in getattr(req, "config", ()) else
            f"{param('etp')} ") + ",".join(map(str, given or ()))
    if shape is None:
        if given and tuple(given) != (1,):
            raise UserError(f"{flag} needs an MoE profile (an analytic profile of the HF "
                            "config of a mixtral, qwen2_moe, qwen3_moe or deepseek_v3 "
                            "model); this profile has no experts")
        return None
    if not given:
        return (1, *tps)
    for e in given:
        check_etp_shape(shape, e, f"{flag}: etp")
        if stages and not any(n % e == 0 for n in stages):
            valid = sorted({d for n in stages for d in range(1, n + 1) if n % d == 0})
            raise UserError(f"{flag}: etp {e} must divide a stage's tp x cp x dp (the expert "
                            f"mesh etp x ep x edp is the stage's ranks), and these degrees "
                            f"leave tp x cp x dp in {', '.join(map(str, sorted(stages)))}; "
                            f"valid are {', '.join(map(str, valid))}")
    return tuple(given)


# ---- pastes ------------------------------------------------------------------------------------
def torchtitan_moe(dims) -> tuple[dict, str | None]:
    """torchtitan's ``[parallelism]`` entries for an MoE plan, ``expert_parallel_degree``
    and (with TP and EP) ``expert_tensor_parallel_degree`` = etp (torchtitan 0.2's TOML: 1,
    its default, or tp), and a note where torchtitan lays the experts out otherwise than
    priced: 0.2 runs etp = tp only with ep a multiple of cp, and etp 1 or tp only; at ep 1
    its experts follow TP whatever etp says; torchtitan 0.3 has no expert tensor
    parallelism (its EP borrows ranks from ``dp_shard x cp x tp``, experts whole: the
    plan's etp 1 layout), so it runs an etp = tp > 1 plan only as ``ep x tp`` at etp 1."""
    out = {"expert_parallel_degree": dims.ep}
    notes = []
    tp, ep, etp = dims.tp, dims.ep, dims.etp
    if etp not in (1, tp):  # torchtitan_blocker refuses the plan; the entry says why
        out["expert_tensor_parallel_degree"] = etp
        notes.append(f"torchtitan runs expert_tensor_parallel_degree 1 or tp {tp} only, "
                     f"not {etp}")
    elif ep > 1 and tp > 1:
        out["expert_tensor_parallel_degree"] = etp
        if etp == tp and ep % dims.cp:
            notes.append(f"torchtitan 0.2 runs expert_tensor_parallel_degree = {tp} only if "
                         f"ep is a multiple of cp {dims.cp}")
        if etp != 1:
            notes.append(f"the plan splits the experts over etp {etp}: torchtitan 0.3 has no "
                         "expert_tensor_parallel_degree (its EP borrows the TP ranks, experts "
                         f"whole: expert_parallel_degree = {ep * etp} at etp 1 is its "
                         "nearest layout, not this plan)")
    elif ep == 1 and etp == 1 < tp:
        notes.append(f"the plan keeps the experts whole (etp {etp}) at ep 1: torchtitan "
                     f"splits them over tp {tp} there (its expert_tensor_parallel_degree "
                     "applies only with ep > 1)")
    return out, "; ".join(notes) or None


def megatron_moe_flags(shape: MoEShape, ep: int, etp: int = 1) -> list[str]:
    """Megatron-Core's MoE flags for the shape at ``ep`` and ``etp``: ``--num-experts``,
    ``--moe-router-topk``, ``--moe-ffn-hidden-size``, ``--expert-model-parallel-size``,
    ``--expert-tensor-parallel-size`` (always written: its default is the TP size; above 1
    with ``--disable-bias-linear``, which Megatron-Core's ``TransformerConfig`` requires of
    an MoE model at ETP > 1, "Bias in Moe is only supported when ETP==1", and these models'
    linear layers have no bias), ``--moe-router-dtype fp32`` (the planner prices the routing
    probabilities, and the ETP reduce-scatter Megatron-Core runs in their dtype, in fp32:
    :func:`etp_block_comm`), the shared experts, the dense layers (``--moe-layer-freq``)
    and MLA."""
    flags = [f"--hidden-size {shape.hidden}", f"--num-attention-heads {shape.heads}",
             f"--num-experts {shape.experts}", f"--moe-router-topk {shape.top_k}",
             f"--moe-ffn-hidden-size {shape.expert_ffn}",
             f"--expert-model-parallel-size {ep}", f"--expert-tensor-parallel-size {etp}",
             "--moe-token-dispatcher-type alltoall", "--moe-router-dtype fp32",
             *(["--disable-bias-linear"] if etp > 1 else []),
             "--swiglu"]
    if shape.shared_experts:
        flags.append(f"--moe-shared-expert-intermediate-size "
                     f"{shape.shared_experts * shape.shared_ffn}")
    if shape.dense_layers:
        pattern = "".join("0" if not shape.is_moe(n) else "1" for n in range(shape.layers))
        flags.append(f"--ffn-hidden-size {shape.dense_ffn} --moe-layer-freq "
                     f"\"[{','.join(pattern)}]\"")
    if shape.mla is not None:
        m = shape.mla
        flags.append(f"--multi-latent-attention --kv-lora-rank {m.kv_rank} "
                     + (f"--q-lora-rank {m.q_rank} " if m.q_rank else "")
                     + f"--qk-head-dim {m.nope_dim} --qk-pos-emb-head-dim {m.rope_dim} "
                       f"--v-head-dim {m.v_dim}")
    elif shape.kv != shape.heads:
        flags.append(f"--group-query-attention --num-query-groups {shape.kv}")
    if not shape.tied_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    return flags


# ---- what the output says ----------------------------------------------------------------------
def moe_model_flops_per_sequence(shape: MoEShape, seq: int) -> float:
    """Model FLOPs of one sequence's forward and backward (3 forwards, no recomputation) on
    the *active* path: each layer's attention (scores in full, as Narayanan et al. count
    them), router, top-k experts, shared experts or dense MLP, and the head ``2 s h V``:
    what MFU divides by for an MoE model."""
    layers = sum(layer_cost(shape, n, seq, 1).forward_flops for n in range(shape.layers))
    return 3 * (layers + 2 * seq * shape.hidden * shape.vocab)


def all_to_all_summary(plan, profiles, hardware, imbalance: float | None = None
                       ) -> dict | None:
    """For an MoE plan: the all-to-all seconds in one microbatch's F and backward of its
    slowest stage (``a2a_f``, ``a2a_b`` of its CostModel: with the ETP pair where
    Megatron-Core's dispatcher gathers over etp > 1, :func:`etp_pair_time`), the nodes an
    EP group spans and the imbalance priced; None for a dense plan."""
    shape = moe_shape_of(profiles)
    if shape is None:
        return None
    costs = plan.costs
    S = len(plan.stage_to_rank)
    f = costs.a2a_f if isinstance(costs.a2a_f, list) else [float(costs.a2a_f)] * S
    b = costs.a2a_b if isinstance(costs.a2a_b, list) else [float(costs.a2a_b)] * S
    slow = max(range(len(costs.f)), key=lambda s: costs.f[s] + costs.b[s])
    gpn = hardware.gpus_per_node if hardware is not None else 1
    stride, size = plan.dims.group("ep")
    span = max(1, -(-(stride * size) // gpn)) if size > 1 else 1
    return {"ep": plan.dims.ep, "nodes": span, "forward": float(f[slow]),
            "backward": float(b[slow]), "experts": shape.experts, "top_k": shape.top_k,
            "expert_data_parallel": plan.dims.expert_data_parallel,
            "efsdp": plan.dims.efsdp,  # the experts' states' shard group (hsdp: of edp)
            "imbalance": imbalance if imbalance is not None else default_imbalance(shape)}
