"""One process per rank: the per-rank driver over torch.distributed.

Every process runs this with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
set (by our launcher, :mod:`pipebubble.runtime.dist.launch`, or by ``torchrun``). With
``P`` pipeline ranks and ``D`` data-parallel replicas there are ``P x D`` processes; global
rank ``g`` is pipeline rank ``g mod P`` of replica ``g // P``.

One step on one rank:

1. a barrier, then the rank's clock origin (``WallClock``);
2. the rank's wire program (``wire.lower``): compute actions go to the stage interpreter,
   SEND/RECV steps to the :class:`~pipebubble.runtime.dist.p2p.P2PTransport`; a watchdog
   (:mod:`~pipebubble.runtime.dist.watchdog`) is told where the rank is before each blocking call;
3. the sends still in flight are waited for;
4. with ``D > 1``, each stage's gradients are all-reduced (summed) across its
   data-parallel group: every replica weights its microbatch losses by their share of the
   *global* batch, so the sum equals the unsplit model's gradient on the global batch.

Rank 0 then gathers every rank's events and figures (:mod:`~pipebubble.runtime.dist.report`).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from ...models import ModelSpec, build_model
from ...ir.schedule import Action, Overlap, Schedule, ScheduleError, validate
from ...schedules import get_schedule
from ...sim.wire import Batch, lower, pair_order_mismatches
from ..clock import WallClock
from ..interpreter import StageInterpreter
from ..local import _with_copies
from ..stages import balanced_boundaries, split_stages
from .launch import is_loopback, loopback_store
from .p2p import P2PTransport
from .watchdog import Watchdog
from ...errors import UserError


@dataclass
class DistConfig:
    """What to run; every process gets the same one (from the same command line)."""

    schedule: str
    ranks: int
    microbatches: int
    chunks: int | None = None
    dp: int = 1
    backend: str = "gloo"
    p2p: str = "batched"
    model: str = "mlp"
    model_args: dict = field(default_factory=dict)
    microbatch_size: int = 4
    warmup: int = 1
    repeat: int = 1
    check: bool = False
    seed: int = 0
    threads: int = 1
    stall_timeout: float = 30.0
    heartbeat_timeout: float = 10.0
    fault: str | None = None  # tests: "kill:RANK:N" or "raise:RANK:N" before compute N

    @property
    def world_size(self) -> int:
        return self.ranks * self.dp


@dataclass
class Env:
    """Where this process sits: from the launcher's (or torchrun's) environment."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    agent_store: bool  # the launcher hosts the store (torchrun, or ours)
    our_launcher: bool

    @staticmethod
    def from_environ() -> Env:
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]
        if missing:
            raise UserError(f"not launched as a distributed worker: {', '.join(missing)} unset")
        return Env(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            master_addr=os.environ["MASTER_ADDR"],
            master_port=int(os.environ["MASTER_PORT"]),
            agent_store=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            our_launcher=os.environ.get("PIPEBUBBLE_LAUNCHER") == "1",
        )


def cut_evenly(layers: list[nn.Module], stages: int) -> list[nn.Module]:
    """``layers`` in ``stages`` contiguous stages whose sizes differ by at most one."""
    try:
        return split_stages(layers, stages, balanced_boundaries(len(layers), stages))
    except ValueError as exc:
        raise ScheduleError(str(exc)) from None


def make_schedule_for(cfg: DistConfig) -> Schedule:
    schedule = get_schedule(cfg.schedule, cfg.ranks, cfg.microbatches, cfg.chunks)
    validate(schedule)
    return schedule


def schedule_name(cfg: DistConfig) -> str:
    return f"{cfg.schedule} (p={cfg.ranks}, m={cfg.microbatches})"


def global_batch(cfg: DistConfig, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's global batch: the same on every process (same seed)."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    chains = make_schedule_for(cfg).chains
    return spec.make_batch(cfg.microbatch_size * cfg.microbatches * chains * cfg.dp, gen)


def build(cfg: DistConfig) -> tuple[Schedule, ModelSpec, list[nn.Module]]:
    """Schedule, model and its stages (of one chain: DualPipe's second chain runs a copy);
    every process builds the same (seeded) model."""
    schedule = make_schedule_for(cfg)
    spec = build_model(cfg.model, seed=cfg.seed, **cfg.model_args)
    return schedule, spec, cut_evenly(spec.layers, schedule.num_stages // schedule.chains)


@dataclass
class RankResult:
    """What one rank sends to rank 0 after a step."""

    global_rank: int
    replica: int
    rank: int
    host: str
    origin: float  # perf_counter() at the clock origin (after the barrier)
    events: list
    losses: dict[int, float]
    allreduce: dict[int, float]  # stage -> seconds
    messages: int
    grads: dict[int, list[torch.Tensor]] | None = None
    peak_bytes: int = 0  # most activation bytes held for later backward passes
    input_bytes: dict = field(default_factory=dict)  # (stage, microbatch) -> input bytes


class Cluster:
    """This process's membership: the store, the process group, the watchdog.

    One Cluster can run several pipelines one after the other (:class:`Worker`), each with
    its own ``P x D`` layout of the same world.
    """

    def __init__(self, env: Env, backend: str = "gloo", stall_timeout: float = 30.0,
                 heartbeat_timeout: float = 10.0, p2p: str = ""):
        self.env, self.g = env, env.rank
        self.store = self._connect()
        timeout = timedelta(seconds=max(60.0, 3 * stall_timeout))
        dist.init_process_group(backend, store=dist.PrefixStore("pg", self.store),
                                rank=self.g, world_size=env.world_size, timeout=timeout)
        self.watchdog = Watchdog(
            self._connect(client=True), self.g, env.world_size, stall_timeout,
            heartbeat_timeout, coordinator=(self.g == 0 and not env.our_launcher), p2p=p2p,
        ).start()

    def _connect(self, client: bool = False):
        env = self.env
        host = not client and self.g == 0 and not env.agent_store
        if host and is_loopback(env.master_addr):  # one machine: listen on loopback only
            store = loopback_store(env.world_size, 60.0, env.master_port)
        else:  # rank 0 of a multi-node run listens on every interface (README, security)
            store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, host,
                                  timeout=timedelta(seconds=60), wait_for_workers=False)
        return dist.PrefixStore("pipebubble", store)

    def close(self) -> None:
        self.watchdog.at("final barrier", True)
        dist.barrier()
        self.watchdog.stop()
        dist.destroy_process_group()


class Worker:
    """This process's part of one pipeline run: its stages, transport and groups."""

    def __init__(self, cfg: DistConfig, cluster: Cluster, built: tuple | None = None,
                 recompute: bool = False):
        """``built``: (schedule, spec, stages, global inputs, global targets) made by the
        caller (the run command's ``build_setup``); by default built from ``cfg``."""
        self.cfg, self.cluster, self.env = cfg, cluster, cluster.env
        self.recompute = recompute
        if self.env.world_size != cfg.world_size:
            raise UserError(
                f"WORLD_SIZE is {self.env.world_size} but --ranks {cfg.ranks} x --dp {cfg.dp} "
                f"needs {cfg.world_size} processes"
            )
        torch.set_num_threads(cfg.threads)
        self.g = cluster.g
        self.replica, self.rank = divmod(self.g, cfg.ranks)
        if built is None:
            self.schedule, self.spec, stages = build(cfg)
            x, y = global_batch(cfg, self.spec)
        else:
            self.schedule, self.spec, stages, x, y = built
        self.wired = lower(self.schedule, cfg.p2p)
        self._next_batch: dict[int, Batch] = {}  # batch index -> the rank's next batch
        batches = [i for i, op in enumerate(self.wired.orders[self.rank])
                   if isinstance(op, Batch)]
        for a, b in zip(batches, batches[1:], strict=False):
            self._next_batch[a] = self.wired.orders[self.rank][b]
        where = self.schedule.stage_to_rank
        self.device = torch.device("cpu")
        if cfg.backend == "nccl":  # one GPU per process; NCCL matches messages in order
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
            bad = pair_order_mismatches(self.wired)
            if bad:
                raise UserError(f"--backend nccl needs messages in the same order at both "
                                 f"ends; {schedule_name(cfg)} with --p2p {cfg.p2p}: {bad[0]}")
        stages, _ = _with_copies(self.schedule, stages)  # DualPipe: the chains' copies
        self.modules = {s: m.to(self.device) for s, m in enumerate(stages)
                        if where[s] == self.rank}
        self.dp_group = None
        if cfg.dp > 1:  # every process creates every group, in the same order
            for r in range(cfg.ranks):
                grp = dist.new_group([d * cfg.ranks + r for d in range(cfg.dp)])
                if r == self.rank:
                    self.dp_group = grp
        self.copy_groups = self._copy_groups(cfg)
        self.watchdog = cluster.watchdog
        self.watchdog.p2p = cfg.p2p
        self.transport = P2PTransport(
            rank=self.rank, stage_to_rank=where, num_microbatches=cfg.microbatches,
            peer_rank=lambda r: self.replica * cfg.ranks + r,
            on_wait=lambda what: self.watchdog.at(what, True), device=self.device,
        )
        if x.shape[0] % cfg.dp:
            raise UserError(f"the global batch of {x.shape[0]} does not split into {cfg.dp} "
                             "replicas")
        n = x.shape[0] // cfg.dp
        mine = slice(self.replica * n, (self.replica + 1) * n)
        total = self.schedule.total_microbatches  # over all chains
        self.xs = list(torch.tensor_split(x[mine].to(self.device), total))
        self.ys = list(torch.tensor_split(y[mine].to(self.device), total))
        self.weights = [xm.shape[0] / x.shape[0] for xm in self.xs]
        self.fault = _parse_fault(cfg.fault)

    def step(self, index: int, gather: bool = True) -> list[RankResult] | None:
        """Run one training step; rank 0 gets every rank's result when ``gather``.

        A gathered (measured) step starts with a barrier that sets the ranks' common time
        origin; an unmeasured one (warm-up, benchmarks) has no barrier of its own.
        """
        for mod in self.modules.values():
            mod.zero_grad(set_to_none=True)
        self.transport.new_step()
        wd = self.watchdog
        if gather:  # a measured step: common time origin (see report.py)
            wd.at(f"step {index} start barrier", True)
            dist.barrier()
        origin = time.perf_counter()
        interp = StageInterpreter(
            rank=self.rank, modules=self.modules, num_stages=self.schedule.num_stages,
            stage_to_rank=self.schedule.stage_to_rank, transport=self.transport,
            clock=WallClock(origin, self.device), inputs=self.xs, targets=self.ys,
            loss_fn=self.spec.loss_fn, loss_weights=self.weights, recompute=self.recompute,
            chain_starts=self.schedule.chain_starts,
            num_microbatches=self.schedule.num_microbatches,
        )
        computes = 0
        order = self.wired.orders[self.rank]
        for i, op in enumerate(order):
            if isinstance(op, Action | Overlap):
                if self.fault and index == self.cfg.warmup and self.fault[1] == self.g \
                        and computes == self.fault[2]:
                    _inject(self.fault[0], self.g, op)
                wd.at(f"{op} (compute)", False)
                interp.run_step(op)  # an Overlap's two parts run in sequence
                computes += 1
            else:
                self.transport.run(op, self._next_batch.get(i))
            wd.advance()
        self.transport.finish()
        self._sync_copies()
        allreduce = self._allreduce()
        wd.at(f"step {index} done", True)
        if not gather:
            return None
        result = RankResult(
            global_rank=self.g, replica=self.replica, rank=self.rank,
            host=socket.gethostname(), origin=origin, events=interp.events,
            losses=dict(interp.losses), allreduce=allreduce,
            messages=self.transport.messages,
            grads=self._grads() if self.cfg.check and self.replica == 0 else None,
            peak_bytes=interp.peak_bytes, input_bytes=dict(interp.input_bytes),
        )
        out = [None] * self.env.world_size if self.g == 0 else None
        wd.at(f"step {index}: gathering results on rank 0", True)
        dist.gather_object(result, out, dst=0)
        return out

    def _copy_groups(self, cfg: DistConfig) -> list[tuple[object, list[int]]]:
        """DualPipe: the ranks holding copies of the same model stage sum their gradients.

        Model stage j runs as stage ``c + j`` of every chain c (chains of equal length); the
        global ranks holding those copies form one group. Every process creates every group
        in the same order (torch.distributed requires it); each keeps the groups it is in,
        with its own stages listed by model stage, so both ends concatenate alike.
        """
        starts, S = self.schedule.chain_starts, self.schedule.num_stages
        if len(starts) < 2:
            return []
        per = S // len(starts)
        where = self.schedule.stage_to_rank
        sets: dict[tuple[int, ...], list[int]] = {}
        for replica in range(cfg.dp):
            for j in range(per):
                ranks = tuple(sorted({replica * cfg.ranks + where[c + j] for c in starts}))
                if len(ranks) > 1:
                    sets.setdefault(ranks, []).append(j)
        mine = []
        for ranks, models in sorted(sets.items()):
            grp = dist.new_group(list(ranks))
            if self.g in ranks:
                stages = sorted((s for s in self.modules if s % per in models),
                                key=lambda s: (s % per, s))
                mine.append((grp, stages))
        return mine

    def _sync_copies(self) -> None:
        """Sum the gradients of each model stage over its copies (one all-reduce per group),
        so every copy holds the gradient of the whole model, as DualPipe's copies do."""
        for grp, stages in self.copy_groups:
            self.watchdog.at(f"sum of model-copy gradients (stages {stages})", True)
            params = [p for s in stages for p in self.modules[s].parameters() if p.requires_grad]
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, group=grp)
            i = 0
            for p in params:
                p.grad.copy_(flat[i : i + p.numel()].view_as(p))
                i += p.numel()
            self.watchdog.advance()

    def _allreduce(self) -> dict[int, float]:
        """Sum each stage's gradients across the data-parallel group; seconds per stage."""
        times: dict[int, float] = {}
        if self.dp_group is None:
            return times
        for s, mod in sorted(self.modules.items()):
            params = [p for p in mod.parameters() if p.requires_grad]
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self.watchdog.at(f"all-reduce of stage {s} gradients (replica group)", True)
            t0 = time.perf_counter()
            flat = torch.cat([p.grad.reshape(-1) for p in params]) if params else None
            if flat is not None:
                dist.all_reduce(flat, group=self.dp_group)
                i = 0
                for p in params:
                    p.grad.copy_(flat[i : i + p.numel()].view_as(p))
                    i += p.numel()
            times[s] = time.perf_counter() - t0
            self.watchdog.advance()
        return times

    def _grads(self) -> dict[int, list[torch.Tensor]]:
        return {
            s: [p.grad.detach().cpu() if p.grad is not None else torch.zeros_like(p, device="cpu")
                for p in mod.parameters()]
            for s, mod in self.modules.items()
        }


def reference_gradients(cfg: DistConfig) -> tuple[float, dict[int, list[torch.Tensor]]]:
    """The unsplit model on the whole global batch: its loss and each stage's gradients."""
    schedule, spec, stages = build(cfg)
    x, y = global_batch(cfg, spec)
    return unsplit_gradients(stages, spec.loss_fn, x, y)


def unsplit_gradients(stages: list[nn.Module], loss_fn, x: torch.Tensor, y: torch.Tensor
                      ) -> tuple[float, dict[int, list[torch.Tensor]]]:
    """Run ``stages`` as one model on the whole batch; the loss and each stage's gradients."""
    for mod in stages:
        mod.zero_grad(set_to_none=True)
    loss = loss_fn(nn.Sequential(*stages)(x), y)
    loss.backward()
    grads = {s: [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                 for p in mod.parameters()] for s, mod in enumerate(stages)}
    return float(loss.detach()), grads


def _parse_fault(text: str | None) -> tuple[str, int, int] | None:
    if not text:
        return None
    kind, rank, n = text.split(":")
    if kind not in ("kill", "raise"):
        raise UserError(f"fault kind must be kill or raise, got {kind!r}")
    return kind, int(rank), int(n)


def _inject(kind: str, g: int, op: Action) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault before {op}")
