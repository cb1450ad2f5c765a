"""The parallel degrees of one plan, in one value: :class:`ParallelDims`.

A plan splits ``world`` GPUs over five axes (torchtitan's ``ParallelDims``, Megatron-Core's
process groups):

- ``tp``: tensor parallel (``sp``: with sequence parallelism over the same ranks);
- ``cp``: context parallel (ring attention over the sequence);
- ``pp``: pipeline parallel (the stages);
- ``dp_replicate`` x ``dp_shard``: data parallel, ``dp`` ranks in all. ``dp_shard`` ranks
  share (shard) the model states, ``dp_replicate`` groups of them hold copies: DDP is
  ``dp_replicate = dp``, ZeRO and FSDP ``dp_shard = dp``, HSDP both above 1 (torchtitan's
  ``data_parallel_replicate_degree`` and ``data_parallel_shard_degree``);
- ``ep``: expert parallel, carved out of the stage's data x context parallel ranks (and
  the TP ranks ETP leaves). Which data-parallel ranks it may take is the framework's rule,
  ``ep_from``: ``"dp"`` (the default), every one of them, replicated or sharded, as
  Megatron-Core's "MoE parallel folding" builds its expert mesh (core 0.16.1
  ``parallel_state.initialize_model_parallel``: an expert ``RankGenerator`` of ``etp x ep
  x expert_dp x pp`` over the same world as the dense one, asking only ``world % (etp x ep
  x pp) == 0`` and ``expert_dp = world / (etp x ep x pp)``; nothing there depends on
  ``--use-distributed-optimizer``, so EP runs over plain DDP ranks too) and DeepSpeed's
  expert groups (``deepspeed/utils/groups.py`` ``_get_expert_parallel_ranks``: ep divides
  ``world / (tp x pp)``, at any ZeRO stage); ``"dp_shard"``, only the sharded ones, as
  torchtitan's mesh (0.3.0 ``distributed/parallel_dims.py``: the sparse mesh ``pp x
  dp_replicate x efsdp x ep`` with ``efsdp = dp_shard x cp x tp / ep``, so EP never takes a
  ``dp_replicate`` rank; 0.2 at ``etp = tp``: ``ep`` divides ``dp_shard x cp``). HSDP's
  degrees (both ``dp_replicate`` and ``dp_shard`` above 1, :attr:`ParallelDims.hybrid`)
  follow torchtitan's rule under either ``ep_from``: only torchtitan runs HSDP. An EP
  group is ``ep`` ranks ``etp`` apart, the expert-data-parallel group the ranks ``etp x
  ep`` apart that hold the same experts (:mod:`pipebubble.plan.expert`);
- ``etp``: expert tensor parallel, the ranks that split each expert's matrices (Megatron-Core
  ``--expert-tensor-parallel-size``, default ``tp``; torchtitan
  ``expert_tensor_parallel_degree``, 1 or ``tp``). ``None`` means ``tp`` (Megatron-Core's
  default, the planner's layout before ETP had a degree of its own). The expert mesh of a
  stage is ``etp x ep x edp = tp x cp x dp`` (Megatron-Core's "MoE parallel folding": its
  expert rank generator is built apart from the dense one, in the order ``tp-cp-ep-dp-pp``
  with ``cp = 1``: ETP innermost, then EP, then expert-data-parallel, PP outermost): an ETP
  group is ``etp`` consecutive ranks, an EP group ``ep`` ranks ``etp`` apart, the
  expert-data-parallel group ``tp x cp x dp / (etp x ep)`` ranks ``etp x ep`` apart. So
  ``etp`` may be below ``tp`` (a slice of a TP group), above it (ETP groups spanning ``etp /
  tp`` TP groups) or neither; the ETP x EP ranks are carved out of ``tp x cp x dp``
  (``tp x cp x dp_shard`` under ``ep_from = "dp_shard"``). An ``etp`` other than ``tp`` at
  ``tp > 1`` needs ``sp``: Megatron-Core trains MoE layers with TP only under sequence
  parallelism (``MoELayer.forward`` raises otherwise, core 0.16.1), each rank dispatching
  its own sequence shard (torchtitan, whose TP is always sequence-parallel, runs etp 1 or
  ``tp`` only).

``world = tp x cp x pp x dp``. The ranks are numbered as both frameworks build their grid:
TP innermost (neighbouring ranks), then CP, then DP, PP outermost. So a group of an axis is
``size`` ranks ``stride`` apart (:meth:`ParallelDims.group`), which is what the network
needs to price it (:meth:`~pipebubble.plan.network.Network.link`), and consecutive pipeline
stages are ``stage_ranks = tp x cp x dp`` ranks apart.

Every product of degrees the planner needs is a property here, so a new axis is one field:

>>> d = ParallelDims(tp=8, cp=2, pp=4, dp_shard=16)
>>> d.world, d.dp, d.non_data_parallel, d.model_parallel, d.data_context, d.stage_ranks
(1024, 16, 64, 16, 32, 256)
>>> d.group("dp"), d.members_per_node("dp", 8), d.groups_per_node("tp", 8)
((16, 16), 1, 1)
>>> ParallelDims(tp=2, cp=2, dp_replicate=2).groups_per_node("tp", 8)  # 4 TP pairs a node
4
>>> try:
...     ParallelDims(tp=0)
... except UserError as exc:
...     print(exc)
tp must be an integer >= 1, got 0
>>> try:
...     ParallelDims(cp=2, dp_shard=3, ep=4)
... except UserError as exc:
...     print(exc)  # doctest: +ELLIPSIS
ep 4 must divide dp x cp = 6 (expert parallelism is carved out of ...); valid are 1, 2, 3, 6
>>> f = ParallelDims(tp=2, dp_replicate=4, ep=4)  # EP over plain DDP ranks (Megatron-Core)
>>> f.expert_data_parallel, f.group("ep"), f.group("edp")
(1, (2, 4), (8, 1))
>>> try:
...     ParallelDims(tp=2, dp_replicate=4, ep=4, ep_from="dp_shard")  # torchtitan's mesh
... except UserError as exc:
...     print(exc)  # doctest: +ELLIPSIS
ep 4 must divide dp_shard x cp = 1 (...); valid are 1
>>> e = ParallelDims(tp=4, sp=True, dp_shard=4, ep=8, etp=1)  # EP borrows the 4 TP ranks
>>> e.expert_data_parallel, e.group("etp"), e.group("ep"), e.group("edp")
(2, (1, 1), (1, 8), (8, 2))
>>> ParallelDims(tp=2, sp=True, dp_shard=4, ep=2, etp=4).group("edp")  # ETP over 2 TP groups
(8, 1)
>>> h = ParallelDims(dp_replicate=4, dp_shard=8, ep=4, etp=1)  # HSDP: EP in the shard group
>>> h.efsdp, h.group("ep"), h.group("efsdp"), h.group("dp_replicate")
(2, (1, 4), (4, 2), (8, 4))
>>> try:
...     ParallelDims(tp=4, sp=True, dp_shard=2, etp=16)
... except UserError as exc:
...     print(exc)  # doctest: +ELLIPSIS
etp 16 must divide tp x dp x cp = 8 (the expert mesh's ...); valid are 1, 2, 4, 8
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UserError, param

DEGREES = ("tp", "cp", "pp", "dp_replicate", "dp_shard", "ep", "etp")
EP_FROM = ("dp", "dp_shard")  # the data-parallel ranks EP may take (module doc)
AXES = ("tp", "cp", "dp", "pp")  # innermost first: the order of the process grid


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of a plan (module doc); validated when made, one line per bad degree."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    ep: int = 1  # expert parallel: inside dp x cp, or dp_shard x cp (ep_from; plan/expert.py)
    sp: bool = False  # sequence parallelism over the tp ranks
    etp: int | None = None  # expert tensor parallel, divides tp (None: tp, Megatron's default)
    ep_from: str = "dp"  # the data-parallel ranks EP takes: dp (Megatron-Core) or dp_shard

    def __post_init__(self) -> None:
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        for name in DEGREES:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.sp, bool):
            raise UserError(f"sp must be a bool (sequence parallelism on or off), got "
                            f"{self.sp!r}")
        if self.sp and self.tp == 1:
            raise UserError("sp needs tp > 1 (sequence parallelism splits TP's replicated "
                            "activations)")
        check_etp_sp(self.tp, self.sp, self.etp)
        if self.ep_from not in EP_FROM:
            raise UserError(f"ep_from must be one of {', '.join(EP_FROM)} (the data-parallel "
                            f"ranks expert parallelism may take), got {self.ep_from!r}")
        data = self.ep_data(self.dp_replicate, self.dp_shard)
        mesh = self.tp * self.cp * data
        what = "dp" if self.ep_from == "dp" and not self.hybrid else "dp_shard"
        if mesh % self.etp:
            valid = ", ".join(str(d) for d in range(1, mesh + 1) if mesh % d == 0)
            raise UserError(f"etp {self.etp} must divide tp x {what} x cp = {mesh} (the "
                            f"expert mesh's ETP x EP ranks are carved out of the stage's TP and "
                            f"CP ranks and {self._ranks_named()}); valid are {valid}")
        room = self.ep_room(data)
        if room % self.ep:
            valid = ", ".join(str(d) for d in range(1, room + 1) if room % d == 0)
            rule = (f"{what} x cp" if self.etp == self.tp else
                    f"tp / etp x {what} x cp" if self.tp % self.etp == 0 else
                    f"tp x {what} x cp / etp")
            raise UserError(f"ep {self.ep} must divide {rule} = {room} (expert "
                            f"parallelism is carved out of the context parallel ranks"
                            + ("" if self.etp == self.tp else ", the TP ranks ETP leaves")
                            + f" and {self._ranks_named()}); valid are {valid}")

    def _ranks_named(self) -> str:
        if self.hybrid:
            return ("HSDP's shard group only, as torchtitan's mesh pp x dp_replicate x efsdp "
                    "x ep lays it out: never dp_replicate")
        return ("the data-parallel ranks, replicated or sharded, as Megatron-Core folds its "
                "expert mesh" if self.ep_from == "dp" else
                "the sharded data-parallel ranks only, as torchtitan's mesh: never "
                "dp_replicate")

    def ep_data(self, dp_replicate: int, dp_shard: int) -> int:
        """The data-parallel ranks EP may take at that split: all ``dp_replicate x
        dp_shard`` of them (``ep_from = "dp"``), or the ``dp_shard`` ones (``"dp_shard"``,
        and HSDP's split, both above 1, under either rule: :attr:`hybrid`)."""
        if self.ep_from == "dp" and not (dp_replicate > 1 and dp_shard > 1):
            return dp_replicate * dp_shard
        return dp_shard

    @property
    def hybrid(self) -> bool:
        """HSDP's degrees: ``dp_replicate`` copies of a ``dp_shard`` group, both above 1.
        Only torchtitan runs HSDP with EP here, and it carves EP out of the shard group
        whatever ``ep_from`` says (module doc): its sparse mesh ``pp x dp_replicate x
        efsdp x ep`` (0.3.0 ``distributed/parallel_dims.py`` ``ParallelDims.build_mesh``)
        keeps ``dp_replicate`` outside EP; Megatron-Core, whose folding lets EP take any
        data-parallel rank, has no HSDP."""
        return self.dp_replicate > 1 and self.dp_shard > 1

    # ---- derived sizes ---------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Data-parallel ranks: replicas x shards."""
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> int:
        """GPUs of the plan: ``tp x cp x pp x dp``."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one copy of one stage together: ``tp x cp``."""
        return self.tp * self.cp

    @property
    def non_data_parallel(self) -> int:
        """Ranks of one model copy: ``tp x cp x pp`` (torchtitan's
        ``non_data_parallel_size``)."""
        return self.model_parallel * self.pp

    @property
    def data_context(self) -> int:
        """Ranks that hold the same weights and reduce gradients together: ``dp x cp``
        (context-parallel ranks hold the same weights, as in Megatron-LM)."""
        return self.dp * self.cp

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage: ``tp x cp x dp``, how far apart consecutive stages
        are in the grid."""
        return self.model_parallel * self.dp

    def stage_distance(self, k: int) -> int:
        """Ranks between a rank and the rank holding its stage ``k`` stages later:
        ``k x stage_ranks`` (the last stage is ``pp - 1`` stages after the first)."""
        return k * self.stage_ranks

    @property
    def expert_data_parallel(self) -> int:
        """The expert-data-parallel ranks: ``tp x cp x dp / (etp x ep)`` (``dp x cp / ep``
        at ``etp = tp``; expert weights are replicated or sharded over them)."""
        return self.stage_ranks // (self.etp * self.ep)

    @property
    def shard_group(self) -> int:
        """HSDP's shard group, ``dp_shard x cp`` ranks (torchtitan's ``fsdp`` mesh: it
        shards over ``dp_shard`` and ``cp`` together, 0.3.0 ``ParallelDims.build_mesh``
        and ``distributed/full_dtensor.py`` ``resolve_fsdp_mesh``)."""
        return self.dp_shard * self.cp

    @property
    def efsdp(self) -> int:
        """The ranks that shard the experts' states: torchtitan's ``efsdp`` under HSDP
        (:attr:`hybrid`), ``tp x cp x dp_shard / (etp x ep)`` (0.3.0 ``efsdp = dp_shard x
        cp x tp / ep``, at the plan's etp 1), the experts replicated over ``dp_replicate``
        (:func:`torchtitan.distributed.fsdp.apply_fsdp_to_decoder` shards the routed
        experts over the 2-D ``edp_mesh`` ``["dp_replicate", "efsdp"]``:
        ``models/deepseek_v3/parallelize.py`` ``parallelize_deepseekv3``); otherwise the
        whole expert-data-parallel group."""
        edp = self.expert_data_parallel
        return edp // self.dp_replicate if self.hybrid else edp

    @property
    def etp_groups(self) -> float:
        """Expert-tensor-parallel groups per TP group, ``tp / etp``: each ETP group serves
        ``1 / etp_groups`` of a TP group's tokens (below 1 at ``etp > tp``: an ETP group
        serves ``etp / tp`` TP groups' tokens). An int when ``etp`` divides ``tp``."""
        return etp_groups(self.tp, self.etp)

    def group(self, axis: str) -> tuple[int, int]:
        """``(stride, size)`` of a group of ``axis`` (``tp``, ``cp``, ``dp``, ``dp_cp``,
        ``etp``, ``ep``, ``edp``, ``pp``) in the grid (module doc): ``dp_cp`` is the data x
        context group of the gradient reduction, ``tp`` ranks apart; the expert mesh
        (Megatron-Core's, ETP innermost): ``etp`` consecutive ranks, the expert-parallel
        group ``ep`` ranks ``etp`` apart (``tp`` apart, in ``cp x dp``, at ``etp = tp``),
        ``edp`` the expert-data-parallel group that reduces the experts' gradients (``etp x
        ep`` apart); under HSDP (:attr:`hybrid`) ``edp`` is ``efsdp`` (the first
        :attr:`efsdp` of them, inside the shard group's block of ``tp x cp x dp_shard``
        ranks) times ``dp_replicate`` (one member a block, ``tp x cp x dp_shard`` apart)."""
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        if axis == "dp_cp":
            return self.tp, self.data_context
        if axis == "etp":
            return 1, self.etp
        if axis == "ep":
            return self.etp, self.ep
        if axis == "edp":
            return self.etp * self.ep, self.expert_data_parallel
        if axis == "efsdp":
            return self.etp * self.ep, self.efsdp
        if axis == "dp_replicate":
            return self.model_parallel * self.dp_shard, self.dp_replicate
        if axis not in sizes:
            raise UserError(f"unknown axis {axis!r}; valid are {', '.join(AXES)}, dp_cp, etp, "
                            "ep, edp, efsdp, dp_replicate")
        stride = 1
        for inner in AXES[:AXES.index(axis)]:
            stride *= sizes[inner]
        return stride, sizes[axis]

    def members_per_node(self, axis: str, gpus_per_node: int) -> int:
        """Members a group of ``axis`` has in each node it spans (1 when its stride is a
        node or more)."""
        stride, size = self.group(axis)
        return 1 if stride >= gpus_per_node else max(1, min(size, gpus_per_node // stride))

    def groups_per_node(self, axis: str, gpus_per_node: int) -> int:
        """Groups of ``axis`` that have members in one node (every GPU of the node is in
        exactly one group of each axis)."""
        return max(1, min(gpus_per_node, self.world) // self.members_per_node(
            axis, gpus_per_node))

    def with_split(self, pp: int, dp_replicate: int, dp_shard: int, ep: int | None = None,
                   etp: int | None = None) -> ParallelDims:
        """These model-parallel degrees with a pipeline and data-parallel split (and
        ``ep``, ``etp``, when given: ``ep`` must divide the split's :meth:`ep_room`)."""
        return replace(self, pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard,
                       ep=self.ep if ep is None else ep, etp=self.etp if etp is None else etp)

    def ep_room(self, data: int, etp: int | None = None) -> int:
        """The ranks EP is carved out of, ``tp x data x cp / etp`` (``tp / etp x data x
        cp`` at an etp dividing tp), ``data`` the data-parallel ranks it may take
        (:meth:`ep_data`: ``dp``, or ``dp_shard`` under torchtitan's rule); ``etp`` None:
        these degrees' own; 0 when ``etp`` does not divide ``tp x data x cp``."""
        e = self.etp if etp is None else etp
        if self.tp % e == 0:
            return data * self.cp * (self.tp // e)
        mesh = self.tp * self.cp * data
        return mesh // e if mesh % e == 0 else 0

    def ep_fits(self, ep: int, data: int, etp: int | None = None) -> bool:
        """Whether ``ep`` divides :meth:`ep_room` (and the room is not empty)."""
        room = self.ep_room(data, etp)
        return room > 0 and room % ep == 0

    def check_world(self, gpus: int, flag: str = param("gpus")) -> None:
        """One line unless the degrees use exactly ``gpus`` GPUs."""
        if self.world != gpus:
            raise UserError(f"tp {self.tp} x cp {self.cp} x pp {self.pp} x dp {self.dp} = "
                            f"{self.world} GPUs, but {flag} is {gpus}; tp x cp x pp x dp must "
                            f"equal {flag}")

    def as_json(self) -> dict:
        return {"tp": self.tp, "sp": self.sp, "cp": self.cp, "pp": self.pp, "dp": self.dp,
                "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "ep": self.ep,
                "etp": self.etp}


def check_etp_sp(tp: int, sp: bool, etp: int) -> None:
    """One line unless an ``etp`` other than ``tp`` at ``tp > 1`` comes with ``sp``
    (module doc: Megatron-Core's ``MoELayer.forward`` refuses MoE training with TP and
    without sequence parallelism; torchtitan's TP is sequence-parallel)."""
    if etp != tp and tp > 1 and not sp:
        raise UserError(f"etp {etp} with tp {tp} needs sp (Megatron-Core trains MoE layers "
                        f"with TP only under sequence parallelism, each rank dispatching its "
                        f"sequence shard; without it the TP ranks hold the same tokens); "
                        f"valid without sp: etp {tp}")


def etp_groups(tp: int, etp: int) -> float:
    """``tp / etp``, the expert-tensor-parallel groups of a TP group
    (:attr:`ParallelDims.etp_groups`): an int when ``etp`` divides ``tp``."""
    return tp // etp if tp % etp == 0 else tp / etp
