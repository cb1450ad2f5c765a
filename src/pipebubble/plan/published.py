"""Published runs the planner is checked against, each number with its source.

The numbers are data files beside the bench, one per source (``bench/published/*.toml``: the
source's text above, each number's place in it beside the number; :func:`load_runs`,
:func:`load_table1`); this module turns each into the step it implies and prices it.

Two parts: Megatron-LM's SC'21 Table 1 (below, :func:`predict_table1`, which fits the A100
efficiency), and the other runs (:func:`published_runs`: Korthikanti et al. 2022, MT-NLG
530B, GPT-NeoX-20B, BLOOM, Llama 3 405B, torchtitan), each planned at its published
configuration through ``plan --config``'s path (:func:`predict_config`), with one efficiency
per GPU fitted once (A100 on Table 1's 18.4B row, also for the A100 40 GB; H100 on the Llama
3 row ``H100_CALIBRATION``), and ranked among the planner's plans (:func:`rank_config`).
``bench/bench_megatron.py`` and ``bench/bench_published.py`` print the tables.

Engines. The planner prices any plan one way: P2P batched and buffered, data-parallel
traffic behind the last backward (Megatron-LM's ``--overlap-grad-reduce``). A run on
DeepSpeed's pipeline engine (BLOOM, MT-NLG, GPT-NeoX-20B: ``Run.engine = "deepspeed"``) is
priced as that engine runs its plan (:func:`~pipebubble.plan.deepspeed.deepspeed_step`):
blocking P2P in its ``TrainSchedule`` order
(:func:`~pipebubble.plan.deepspeed.deepspeed_lowering`, simulated by
:func:`pipebubble.sim.wire.run_wire`) and the reduction after the flush. Every other row is
priced as the planner prices it, so neither efficiency moves.

Memory. A published run ran, so memory is not in question for its own configuration: what
is checked is the time model. Each published configuration is therefore priced against the
GPU's physical memory (no reserve), and :func:`predict_runs` reports beside it whether its
peak rank also fits the planner's default budget (the GPU less ``RESERVE``, 5 %: ``plan
--reserve 5%``) and what the planner would price for the configuration under that budget.
Llama 3 on 8,192 GPUs is the row where this decides: at the paper's layout the interleaved
schedule needs 76.5 GiB on rank 1, under the H100's 79.65 GiB (+0.3 %) but over the 75.67
GiB the reserve leaves, where the planner falls back to 1F1B (-26.7 %). The ranking is taken
at the same memory: the planner's own plans also get the physical memory, so that the
published configuration competes with plans given what it had (plans that use the last 5 %
have not been shown to run; a plan ranked above the published one may need that much).
Table 1 is planned at the physical memory as well; every one of its rows plans the same
(microbatch size, chunks) at the reserve, so none of its figures depends on it.

Narayanan et al., *Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM* (SC'21), Table 1: GPT models on A100 80 GB (DGX A100: 8 GPUs a node, NVLink3,
8 x 200 Gb/s HDR InfiniBand), fp16, vocabulary 51,200, sequence 2,048, the interleaved
schedule, full activation recomputation, data-parallel all-reduce without a distributed
optimizer. The table gives TP, PP, the GPUs, the global batch and the achieved TFLOP/s per
GPU, counted by their eq. 3 (with recomputation):

    FLOPs per step = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))

so the step time is that over (GPUs x TFLOP/s). :func:`predict_table1` calibrates the compute
model's efficiency on one row (``plan --config ... --measured-step``) and predicts the others
with the published TP, PP and data parallelism, searching what the paper does not give
(microbatch size, chunks). ``bench/bench_megatron.py`` prints the table.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from ..schedules import lookup
from .analytic import TransformerShape, shape_profile
from .deepspeed import deepspeed_step
from .dims import ParallelDims
from .fit import fit_efficiency
from .frameworks import SAME_CHIP  # chips whose efficiency is another's
from .hardware import get_hardware
from .layercosts import ProfileSet
from .plans import NoPlanFits, Request

SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True)
class Row:
    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops: float  # achieved per GPU, published

    @property
    def dp(self) -> int:
        return self.gpus // ParallelDims(tp=self.tp, pp=self.pp).non_data_parallel

    def flops(self) -> float:
        """Eq. 3: FLOPs of one step with full recomputation."""
        B, s, l, h, V = self.batch, SEQ, self.layers, self.hidden, VOCAB
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))

    def step_time(self) -> float:
        """The published step: eq. 3 FLOPs / (GPUs x TFLOP/s)."""
        return self.flops() / (self.gpus * self.tflops * 1e12)


def shape_of(row: Row) -> TransformerShape:
    """Megatron's GPT: 4h GELU MLP, learned positions, biases, dropout, tied embeddings."""
    return TransformerShape(layers=row.layers, hidden=row.hidden, ffn=4 * row.hidden,
                            heads=row.heads, vocab=VOCAB, tied_embeddings=True, swiglu=False,
                            positions=SEQ, dropout=True, biases=True)


def _megatron() -> tuple[str, ...]:
    """The families Megatron-LM pipelines (1F1B and interleaved 1F1B): what its published
    runs chose among."""
    from .settings import megatron_families

    return tuple(megatron_families())


def request_of(row: Row, gpu_memory: float) -> Request:
    """The published configuration; microbatch size and chunks searched."""
    return Request(gpus=row.gpus, gpu_memory=gpu_memory, global_batch=row.batch,
                   microbatch_sizes=(1, 2, 4, 8), schedules=_megatron(),
                   max_chunks=4, recompute=("full",), tp=(row.tp,), pp=(row.pp,), cp=(1,),
                   sp=(False,), shardings=("ddp",), grad_bytes=4.0, top=1)


def predict_row(row: Row, hw, efficiency: float):
    """The planner's best plan for the row's published configuration."""
    from .planner import search

    prof = ProfileSet([shape_profile(shape_of(row), SEQ, 1, attention="unfused")])
    hw = replace(hw, efficiency=efficiency, tp_overlap=False)  # measured before Megatron-LM
    # overlapped the backward's TP all-reduces with weight gradients (September 2021)
    # the physical memory, as for every published run (``RESERVE``): at the 5 % reserve every
    # row plans the same (microbatch size and chunks), so no Table 1 figure depends on it
    return search(prof, request_of(row, hw.memory), hw, efficiency).plans[0]


def predict_table1(calibrate_on: str = "18.4B") -> tuple[float, list[dict]]:
    """(the efficiency fitted on ``calibrate_on``, one dict per row: published and predicted
    TFLOP/s, the relative error, the plan's microbatch size and chunks)."""
    hw = get_hardware("a100-80gb")
    cal = next(r for r in TABLE1 if r.name == calibrate_on)
    eff = fit_efficiency(lambda e: predict_row(cal, hw, e).step_time, cal.step_time())
    out = []
    for row in TABLE1:
        plan = predict_row(row, hw, eff)
        tflops = row.flops() / (plan.step_time * row.gpus) / 1e12
        out.append({"model": row.name, "tp": row.tp, "pp": row.pp, "gpus": row.gpus,
                    "batch": row.batch, "published": row.tflops, "predicted": tflops,
                    "error": tflops / row.tflops - 1, "microbatch_size": plan.microbatch_size,
                    "chunks": plan.chunks, "schedule": plan.schedule,
                    "bubble": plan.bubble_fraction, "calibration": row.name == calibrate_on})
    return eff, out


# ---- other published runs: one efficiency per GPU, each run at its published configuration --

@dataclass(frozen=True)
class Run:
    """One published training run: the model, the machine, the configuration it ran
    (``plan --config`` text), and its published throughput in the source's own metric.

    ``step`` is the published step in seconds, derived from that metric by the source's FLOP
    count (:func:`published_runs` says which per run); every metric here is inversely
    proportional to the step, so a prediction is reported as ``published x step / predicted``.
    """

    source: str  # short reference
    name: str
    shape: TransformerShape
    seq: int
    gpus: int
    batch: int  # sequences per step
    gpu: str
    config: str  # plan --config
    metric: str  # what the source publishes: "MFU", "TFLOP/s", "tokens/s"
    published: float
    step: float  # the published step, seconds
    flash: bool = True
    search: tuple = ()  # (field, values) the planner may choose where the source is silent
    hardware: tuple = ()  # (field, value) overrides of the preset (the machine as published)
    note: str = ""
    engine: str = ""  # the pipeline engine it ran on, where its pricing differs from the
    # planner's (ENGINES): "deepspeed" for DeepSpeed's PipelineEngine (deepspeed_step)
    grad_wire: float = 4.0  # bytes a gradient on the data-parallel wire (its data file's
    # grad_wire_bytes: 2 where DeepSpeed reduced fp16 gradients as they are)
    framework: str = "megatron"  # whose calibration prices it (plan/frameworks.py)


ENGINES = ("", "deepspeed")  # "": priced as the planner prices any plan (batched P2P, the
# data-parallel traffic behind the last backward); "deepspeed": :func:`deepspeed_step`


A100_PEAK, H100_PEAK = 312e12, 989e12


def _gpt(layers, hidden, heads, vocab=VOCAB, positions=SEQ) -> TransformerShape:
    return TransformerShape(layers=layers, hidden=hidden, ffn=4 * hidden, heads=heads,
                            vocab=vocab, tied_embeddings=True, swiglu=False,
                            positions=positions, dropout=True, biases=True)


def korthikanti_flops(shape: TransformerShape, seq: int, batch: int) -> float:
    """Korthikanti et al. 2022 eq. 7, model FLOPs (no recomputation):
    ``72 B L s h^2 (1 + s / (6 h) + V / (12 h L))``."""
    B, s, L, h, V = batch, seq, shape.layers, shape.hidden, shape.vocab
    return 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def neox_flops(shape: TransformerShape, seq: int, batch: int, params: float) -> float:
    """The FLOPs of a step as gpt-neox counted them when GPT-NeoX-20B was trained
    (``megatron/logging.py`` ``get_flops`` from 2021 to September 2023, EleutherAI/gpt-neox
    c560814b, the 20B release): ``B s (6 N + 60 s h L)``, ``N`` the model's parameters
    (``get_total_params``). Model FLOPs: no recomputation factor, whatever the run
    recomputed (the factor came with #1044, September 2023, from Megatron-DeepSpeed).

    >>> from pipebubble.plan.analytic import TransformerShape
    >>> sh = TransformerShape(layers=2, hidden=8, ffn=32, heads=2, vocab=16)
    >>> neox_flops(sh, seq=4, batch=1, params=100)  # 4 x (600 + 60 x 4 x 8 x 2)
    17760.0
    """
    return float(batch * seq * (6 * params + 60 * seq * shape.hidden * shape.layers))


def llama_flops(shape: TransformerShape, seq: int, batch: int) -> float:
    """Model FLOPs of a LLaMA step as a causal FlashAttention kernel executes them: ``6`` per
    token and matrix parameter (blocks and head) plus the causal half of attention's
    ``12 L s^2 q``. (The Llama 3 paper does not give its count; counting attention in full
    would raise the 131,072-token row's FLOPs by 40 % and the 8,192-token rows' by 4 %.)"""
    q = shape.heads * shape.head_dim
    per_seq = 3 * (2 * seq * shape.layers * shape.block_matmul_params()
                   + 2 * shape.layers * seq * seq * q + 2 * seq * shape.hidden * shape.vocab)
    return per_seq * batch




DATA = Path(__file__).resolve().parents[3] / "bench" / "published"
"""The published runs as data files beside the bench, one per source (TOML: each number with
its source in a comment beside it, the source's text above): :data:`RUN_FILES` in their
order, and Table 1 (:data:`TABLE1_FILE`)."""
RUN_FILES = ("korthikanti_2022", "mt_nlg_530b", "gpt_neox_20b", "bloom_176b", "llama3_405b",
             "torchtitan_llama31_8b")
TABLE1_FILE = "megatron_sc21_table1"


def _read(name: str, directory: Path | None = None) -> dict:
    path = (directory or DATA) / f"{name}.toml"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: the published runs are data files in the "
                                "repository's bench/published/ (run from a checkout)") from None


def _shape(fields: dict) -> TransformerShape:
    """A TransformerShape from a file's ``shape`` table (``ffn_factor``: ffn = factor x h)."""
    f = dict(fields)
    if "ffn_factor" in f:
        f["ffn"] = f.pop("ffn_factor") * f["hidden"]
    return TransformerShape(**f)


def _step(r: dict, shape: TransformerShape) -> float:
    """The published step in seconds from the run's metric (its ``step_from``)."""
    how, B, s, n, x = r["step_from"], r["batch"], r["seq"], r["gpus"], r["published"]
    if how == "seconds":
        return float(r["seconds"])
    if how == "korthikanti-eq7":
        return korthikanti_flops(shape, s, B) / (x * n * r["mfu_peak"])
    if how == "megatron-eq3":
        L, h, V = shape.layers, shape.hidden, shape.vocab
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)) / (n * x * 1e12)
    if how == "neox-2022":
        return neox_flops(shape, s, B, r["flop_params"]) / (n * x * 1e12)
    if how == "llama":
        return llama_flops(shape, s, B) / (x * 1e12 * n)
    if how == "tokens":
        return B * s / (x * n)
    raise ValueError(f"run {r['name']!r}: unknown step_from {how!r}; valid are seconds, "
                     "korthikanti-eq7, megatron-eq3, neox-2022, llama, tokens")


def load_runs(directory: Path | None = None) -> tuple[Run, ...]:
    """Every run of :data:`RUN_FILES` (each file's ``defaults`` under each ``run``)."""
    runs = []
    for name in RUN_FILES:
        data = _read(name, directory)
        base = data.get("defaults", {})
        for item in data["run"]:
            r = {"source": data.get("source"), **base, **item,
                 "shape": {**base.get("shape", {}), **item.get("shape", {})}}
            shape = _shape(r["shape"])
            search = tuple((k, _megatron() if v == "megatron" else
                            tuple(v) if isinstance(v, list) else v)
                           for k, v in r.get("search", {}).items())
            runs.append(Run(r["source"], r["name"], shape, r["seq"], r["gpus"], r["batch"],
                            r["gpu"], r["config"], r["metric"], r["published"], _step(r, shape),
                            flash=r.get("flash", True), search=search,
                            hardware=tuple(r.get("hardware", {}).items()),
                            note=r.get("note", ""), engine=r.get("engine", ""),
                            grad_wire=float(r.get("grad_wire_bytes", 4.0)),
                            framework=r.get("framework", "megatron")))
    return tuple(runs)


def load_table1(directory: Path | None = None) -> tuple[Row, ...]:
    """Megatron-LM's SC'21 Table 1 rows (:data:`TABLE1_FILE`)."""
    return tuple(Row(*row) for row in _read(TABLE1_FILE, directory)["rows"])


def published_runs() -> tuple[Run, ...]:
    """The runs, each number from its source (bench/published/*.toml: :func:`load_runs`)."""
    return load_runs()


TABLE1 = load_table1()
LLAMA3_405B = _shape(_read("llama3_405b")["defaults"]["shape"])  # Llama 3's Table 3 shape


H100_CALIBRATION = "405B 8K 16k"  # the Llama 3 row the H100 efficiency is fitted on: 16,384
# GPUs, sequence 8,192. Kept from when configurations were priced at the 5 % reserve, under
# which the 8,192-GPU row falls back to 1F1B and could not be fitted on; at the physical
# memory it could (0.549 against this row's 0.551), so the choice moves nothing.


RESERVE = 0.05  # the planner's default reserve (``plan --reserve 5%``): its budget is the
# GPU's memory less 5 %, for what the memory model does not count (CUDA context, NCCL
# buffers, the allocator's fragmentation). A published run ran, so its own configuration is
# priced against the physical memory (``reserve=0``) and the reserve is reported beside it.


def _setup(run: Run, efficiency: float, top: int = 1, reserve: float = 0.0,
           framework: str | None = None):
    """(profiles, the request as ``plan`` builds it, the hardware): the model at the run's
    sequence, the GPU preset with the run's overrides, the budget the GPU's memory less
    ``reserve`` (a fraction; 0: the physical memory); with ``framework``, priced under its
    profile (:func:`~pipebubble.plan.frameworks.apply`: its data-parallel and TP overlap,
    reshard policy) at the run's own precision and model states (its source's)."""
    from ..schedules import schedule_names
    from .frameworks import apply, settings

    hw = replace(get_hardware(run.gpu), **dict(run.hardware), efficiency=efficiency)
    prof = ProfileSet([shape_profile(run.shape, run.seq, 1,
                                     attention="flash" if run.flash else "unfused")])
    fields = dict(microbatch_sizes=(1, 2, 4), max_chunks=4, recompute=None,
                  schedules=tuple(schedule_names(searched=False)))
    fields.update(run.search)
    req = Request(gpus=run.gpus, gpu_memory=hw.memory * (1 - reserve), global_batch=run.batch,
                  grad_bytes=run.grad_wire, top=top, **fields)
    if framework is not None:
        fw = replace(settings(framework), state_bytes=None, grad_wire=None,
                     grad_accumulation_bytes=None)  # the run's own (its source's)
        req, hw = apply(fw, req, hw)
    return prof, req, hw


def predict_config(run: Run, efficiency: float, reserve: float = 0.0):
    """The planner's plan for the run's published configuration (what ``plan --config`` puts
    beside the plans: the request restricted to the configuration, the rest searched), at
    the physical memory unless ``reserve`` is given."""
    return _predict(run, efficiency, reserve)[0]


def _predict(run: Run, efficiency: float, reserve: float = 0.0, framework: str | None = None,
             config: str = ""):
    """(the plan, whether it fits the budget: the GPU's memory less ``reserve``); one that
    does not is the least-memory plan, as ``plan --config`` reports it. ``framework``:
    priced under its profile (:func:`_setup`); ``config``: ``plan --config`` text appended
    to the run's."""
    from .config import parse_config, restrict
    from .planner import search

    prof, req, hw = _setup(run, efficiency, reserve=reserve, framework=framework)
    one = replace(restrict(req, parse_config(run.config + config, run.gpus)), top=1)
    try:
        return search(prof, one, hw, efficiency).plans[0], True
    except NoPlanFits as exc:
        if exc.plan is None:
            raise
        return exc.plan, False


def engine_step(run: Run, plan, efficiency: float) -> float:
    """``plan``'s step as ``run``'s engine runs it (:data:`ENGINES`)."""
    if run.engine not in ENGINES:
        raise ValueError(f"unknown engine {run.engine!r} of run {run.name!r}; valid are "
                         f"{', '.join(repr(e) for e in ENGINES)}")
    if run.engine != "deepspeed":
        return plan.step_time
    hw = replace(get_hardware(run.gpu), **dict(run.hardware), efficiency=efficiency)
    tied = run.shape.vocab * run.shape.hidden if run.shape.tied_embeddings else 0.0
    boundary = 2.0 * run.seq * plan.microbatch_size * run.shape.hidden  # 16-bit, s b h
    return deepspeed_step(plan, hw, tied, boundary)


def framework_plan(run: Run, efficiency: float, config: str = "") -> tuple:
    """(the plan, its step as the run's engine runs it) of ``run``'s published configuration
    (plus ``config``) priced under its framework's profile (``Run.framework``) at
    ``efficiency``, at the physical memory: what ``bench/bench_frameworks.py`` fits and
    predicts."""
    plan = _predict(run, efficiency, framework=run.framework, config=config)[0]
    return plan, engine_step(run, plan, efficiency)


FRAMEWORK_FITS = {("a100-80gb", "megatron"): "18.4B", ("h100-sxm", "megatron"): H100_CALIBRATION,
                  ("h100-sxm", "torchtitan"): "8B FSDP 8", ("a100-80gb", "deepspeed"): "20B"}
"""The run each (GPU, framework) efficiency is fitted on (``plan/frameworks.py``
``CALIBRATIONS`` records the figures): Megatron-LM's A100 on Table 1's 18.4B row
(:func:`predict_table1`), the others on the named published run. DeepSpeed's A100 on
GPT-NeoX-20B: of its five runs, the one whose fit predicts the other four with the smallest
worst error (:func:`fits_by_candidate`; ``bench/bench_frameworks.py`` prints each)."""


def fits_by_candidate(gpu: str, framework: str, runs: tuple[Run, ...] | None = None
                      ) -> list[tuple[Run, float, dict[str, float]]]:
    """For each published run of (``gpu``, ``framework``) (through :data:`SAME_CHIP`) as the
    calibration point: (the run, the efficiency fitted on it, ``{other run's name:
    predicted / published step - 1}`` at that efficiency), each priced as
    :func:`framework_plan` prices it."""
    runs = runs or published_runs()
    mine = [r for r in runs if r.framework == framework and SAME_CHIP.get(r.gpu, r.gpu) == gpu]
    out = []
    for cal in mine:
        e = fitted_on(cal)
        out.append((cal, e, {r.name: float(framework_plan(r, e)[1] / r.step - 1)
                             for r in mine if r is not cal}))
    return out


def fitted_on(run: Run) -> float:
    """The efficiency at which ``run``'s published configuration, priced under its framework
    (:func:`framework_plan`), takes its published step."""
    return fit_efficiency(lambda e: framework_plan(run, e)[1], run.step)


def framework_efficiencies(runs: tuple[Run, ...] | None = None) -> dict:
    """``{(gpu, framework): efficiency}`` fitted on :data:`FRAMEWORK_FITS`."""
    runs = runs or published_runs()
    out = {}
    for (gpu, fw), name in FRAMEWORK_FITS.items():
        if (gpu, fw) == ("a100-80gb", "megatron"):
            out[gpu, fw] = predict_table1(name)[0]
            continue
        out[gpu, fw] = fitted_on(next(r for r in runs if r.name == name))
    return out


def rank_config(run: Run, efficiency: float, top: int = 30, reserve: float = 0.0,
                framework: str | None = None, prune: bool = True) -> tuple:
    """(the published configuration's rank among the planner's ``top`` plans, None if
    slower than all of them; the planner's own best plan; its step), as ``plan --config``
    ranks it: every axis searched (tp, sp, cp, pp, dp, sharding, microbatch size, every
    schedule family but ``auto``, chunks, every recompute mode the framework runs, so that
    the published one is among them). Both under the same budget, the GPU's memory less
    ``reserve`` (0 by default: the physical memory the published configuration is priced
    at), so that the published configuration competes with plans given the same memory.

    ``framework``: both priced under its profile (:func:`_setup`: its traffic, overlap and
    model states) and ranked among the plans it runs (its schedules, shardings, recompute
    modes, sequence parallelism where it has it and DeepSpeed's cp 1 searched,
    :func:`~pipebubble.plan.frameworks.narrowed`, and the plans
    :func:`~pipebubble.plan.frameworks.blocker` passes, as ``plan --config --framework``
    ranks), with the published configuration counted as one it runs (it ran there: Llama 3's
    ZeRO-2 under PP is not Megatron-LM's, whose calibration prices it); then each of the
    ``top`` plans at its step as the run's engine runs it (:func:`engine_step`), so that a
    DeepSpeed row's pick is the fastest of them on DeepSpeed's pipeline engine. ``None`` or
    ``none``: every plan, at the planner's pricing.

    ``prune``: skip the engine's pricing of a plan whose planner step is already past both
    the published configuration's engine step and the best found, which is exact when no
    plan's engine step is under its planner step (tests/test_plan_published_rank.py checks
    that on every plan of the DeepSpeed rows it searches, and that the pick is the same
    without pruning)."""
    mine, plans, step = ranked_plans(run, efficiency, top, reserve, framework)
    ours, steps = step(mine), {}
    for p in plans:  # fastest first by the planner's step
        if not prune or p.step_time < max(ours, min(steps.values(), default=math.inf)):
            steps[id(p)] = step(p)
    faster = sum(1 for x in steps.values() if x < ours * (1 - 1e-12))
    best = min(plans, key=lambda p: (steps.get(id(p), math.inf), plans.index(p)))
    return (faster + 1 if faster < len(plans) else None), best, steps.get(id(best), step(best))


def ranked_plans(run: Run, efficiency: float, top: int = 30, reserve: float = 0.0,
                 framework: str | None = None) -> tuple:
    """(the published configuration's plan, the ``top`` plans :func:`rank_config` ranks it
    among, fastest first by the planner's step, the step each is ranked by: the run's
    engine's under a framework, else the planner's)."""
    from ..schedules import schedule_names
    from .frameworks import blocker, narrowed, recompute_modes
    from .planner import search

    prof, req, hw = _setup(run, efficiency, top, reserve, framework)
    req = replace(req, schedules=tuple(schedule_names(searched=False)),
                  recompute=req.recompute or recompute_modes(framework or "none"))
    mine = _predict(run, efficiency, reserve, framework)[0]
    keep, step = None, (lambda p: p.step_time)
    if framework not in (None, "none"):
        req = narrowed(framework, req)
        if req is None:
            raise ValueError(f"run {run.name!r}: framework {framework!r} runs none of the "
                             "schedules, shardings and recompute modes searched")

        def keep(p) -> bool:
            return blocker(framework, p) is None or p.config == mine.config

        def step(p) -> float:
            return engine_step(run, p, efficiency)
    if req.cp is None:  # the planner's cp (1, 2, 4, 8) and the published one (Llama 3's 16)
        req = replace(req, cp=tuple(sorted({1, 2, 4, 8, mine.config.cp})))
    return mine, search(prof, req, hw, efficiency, keep=keep).plans, step


def memory_of(run: Run) -> float:
    """The physical memory of one of the run's GPUs, bytes (the preset with its overrides)."""
    return replace(get_hardware(run.gpu), **dict(run.hardware)).memory


def a100_efficiency() -> float:
    """The A100 efficiency: Megatron-LM's SC'21 Table 1, calibrated on its 18.4B row."""
    return predict_table1()[0]


def h100_efficiency(runs: tuple[Run, ...] | None = None) -> float:
    """The H100 efficiency: fitted to the Llama 3 405B row ``H100_CALIBRATION``."""
    runs = runs or published_runs()
    cal = next(r for r in runs if r.name == H100_CALIBRATION)
    return fit_efficiency(lambda e: predict_config(cal, e).step_time, cal.step)


def predict_runs(runs: tuple[Run, ...] | None = None, ranks: bool = False,
                 efficiencies: dict | None = None,
                 by_framework: bool = False) -> tuple[dict, list[dict]]:
    """(the efficiencies, one dict per run: published and predicted metric, the error, the
    plan chosen for the published configuration and, with ``ranks``, its rank among the
    planner's plans and the planner's own pick with its predicted margin).

    Two calibrations. By default one efficiency per GPU (``{gpu: efficiency}``: Megatron-LM's
    A100 fit, the Llama 3 H100 fit) and the planner's own pricing. ``by_framework``: each run
    at its (GPU, framework) fit (``{(gpu, framework): efficiency}``,
    :func:`framework_efficiencies`) and priced under its framework's profile, as
    ``bench/bench_frameworks.py`` prices it; ``gpu_error`` is then the error at the GPU's
    Megatron-LM fit with the planner's pricing, beside it."""
    runs = runs or published_runs()
    eff = dict(efficiencies or {})
    if by_framework:
        if not all(k in eff for k in FRAMEWORK_FITS):
            eff = {**framework_efficiencies(runs), **eff}
        per_gpu = {g: eff[g, "megatron"] for g in ("a100-80gb", "h100-sxm")}
    else:
        if "a100-80gb" not in eff:
            eff["a100-80gb"] = a100_efficiency()
        if "h100-sxm" not in eff:
            eff["h100-sxm"] = h100_efficiency(runs)
        per_gpu = eff
    out = []
    for run in runs:
        gpu = SAME_CHIP.get(run.gpu, run.gpu)
        fw = run.framework if by_framework else None
        e = eff[gpu, run.framework] if by_framework else eff[gpu]
        plan, fits = _predict(run, e, framework=fw)
        step = engine_step(run, plan, e)
        tight, tight_fits = _predict(run, e, RESERVE, framework=fw)
        rank, best, best_step = rank_config(run, e, framework=fw) if ranks else (
            None, None, None)
        physical = memory_of(run)
        need = max(plan.peak_memory)
        fit_on = (FRAMEWORK_FITS.get((gpu, run.framework)) if by_framework else
                  H100_CALIBRATION)
        item = {"source": run.source, "model": run.name, "gpus": run.gpus,
                "config": run.config, "metric": run.metric, "published": run.published,
                "predicted": run.published * run.step / step,
                "error": run.step / step - 1, "step": step, "engine": run.engine,
                "framework": run.framework, "efficiency": e,
                "planner_error": run.step / plan.step_time - 1, "plan": plan, "rank": rank,
                "best": best, "calibration": run.name == fit_on, "note": run.note,
                "fits": fits, "need": need, "physical": physical,
                "reserve_budget": physical * (1 - RESERVE),
                "fits_reserve": need <= physical * (1 - RESERVE),
                "reserve_plan": tight, "reserve_plan_fits": tight_fits,
                "reserve_error": run.step / (step if (tight.config, tight.step_time) == (
                    plan.config, plan.step_time) else engine_step(run, tight, e)) - 1,
                "best_step": best_step,
                "margin": (step if fw else plan.step_time) / best_step - 1
                if best is not None else None}
        if by_framework:
            g = per_gpu[gpu]
            item["gpu_error"] = run.step / engine_step(run, _predict(run, g)[0], g) - 1
        out.append(item)
    return eff, out


def interleaved_in_flight(p: int, v: int, m: int, rank: int) -> int:
    """Chunk forwards rank ``rank`` has done before its first backward in Megatron-LM's
    interleaved 1F1B (``megatron/core/pipeline_parallel/schedules.py``): its warm-up
    ``2 (p - rank - 1) + (v - 1) p`` (microbatch groups of ``p``), capped at all ``m v``,
    plus the first steady-state forward, which runs before the first backward. Each of them
    holds its chunk's activations at the rank's peak.

    >>> interleaved_in_flight(16, 8, 32, 1), interleaved_in_flight(16, 8, 16, 1)
    (141, 128)
    """
    warm = min(2 * (p - rank - 1) + (v - 1) * p, m * v)
    return warm + (1 if warm < m * v else 0)


def memory_breakdown(run: Run, efficiency: float, config: str = "") -> tuple:
    """(the plan, one dict per pipeline rank) of ``run`` at its configuration plus ``config``
    (``plan --config`` text appended), with the budget lifted so that it is planned whatever
    it needs: per rank the blocks and end layers it holds, its local parameters, the model
    states and the simulated activation peak (bytes, the plan's ``memory``), the peak in
    units of one block's activations, and, for the interleaved schedule, the chunk forwards
    in flight by Megatron-LM's warm-up count (:func:`interleaved_in_flight`), to check the
    simulator against by hand (``bench_published.py --memory``)."""
    from .config import parse_config, restrict
    from .planner import search

    prof, req, hw = _setup(run, efficiency)
    one = replace(restrict(req, parse_config(run.config + config, run.gpus)), top=1,
                  gpu_memory=1e15)
    plan = search(prof, one, hw, efficiency).plans[0]
    lc = plan.costs
    act = list(lc.activation_memory)
    n = len(plan.ranges)
    last = len(act) // n * n  # stages of one model copy
    block = act[1] if n > 1 else act[0]
    rows = []
    for r in range(plan.pp):
        stages = [s for s, x in enumerate(plan.stage_to_rank) if x == r and s < last]
        layers = [i for s in stages for i in range(plan.ranges[s][0], plan.ranges[s][1] + 1)]
        blocks = sum(1 for i in layers if 0 < i < len(prof) - 1)
        row = {"rank": r, "blocks": blocks, "embedding": 0 in layers,
               "head": len(prof) - 1 in layers, **plan.memory[r],
               "peak": plan.peak_memory[r], "physical": hw.memory,
               "budget": hw.memory * (1 - RESERVE),
               "block_activation": block,
               "in_flight_blocks": plan.memory[r]["activations"] / block}
        if plan.chunks > 1 and lookup(plan.schedule).megatron:  # Megatron's interleaved
            row["megatron_in_flight"] = interleaved_in_flight(plan.pp, plan.chunks,
                                                              plan.microbatches, r)
        rows.append(row)
    return plan, rows


# Korthikanti et al. 2022, Table 4: forward and backward milliseconds of one transformer
# layer of the 22B model (a = 64, h = 6144, TP 8, s = 2048; the microbatch of its Table 3,
# 4 sequences), by technique: (sequence parallel, recompute, forward, backward).
TABLE4 = (
    ("baseline (no recompute)", False, "none", 7.7, 11.9),
    ("sequence parallel", True, "none", 7.2, 11.8),
    ("full recompute", False, "full", 7.7, 19.5),
    ("selective recompute", False, "selective", 7.7, 13.2),
    ("selective + sequence parallel", True, "selective", 7.2, 13.1),
)


def layer_times(efficiency: float, tp_overlap: bool = True) -> list[dict]:
    """Table 4's rows beside the planner's forward and backward (I + W, with what the
    recompute re-runs) of one 22B block on the A100 preset at ``efficiency``."""
    from .compute import Rates
    from .network import Network
    from .parallel_costs import ParallelCosts

    shape = _gpt(48, 6144, 64)
    hw = replace(get_hardware("a100-80gb"), efficiency=efficiency, tp_overlap=tp_overlap)
    out = []
    for name, sp, rec, fwd, bwd in TABLE4:
        lc = ParallelCosts(shape, SEQ, Rates.of(hw), Network.of(hw), tp=8, sp=sp,
                           flash=False).at(4, rec)
        f, b = lc.f[1] * 1e3, (lc.i[1] + lc.w[1]) * 1e3
        out.append({"technique": name, "forward": fwd, "backward": bwd, "predicted_forward": f,
                    "predicted_backward": b, "error": (f + b) / (fwd + bwd) - 1})
    return out


def explain_pick(run: Run, efficiency: float) -> list[dict]:
    """Why the planner's pick for ``run`` differs from the published configuration: the pick
    (every axis, every family but ``auto``) with the backward's TP collectives overlapped and
    not, and within the families the source had (``run.search``), each beside the published
    configuration priced the same way."""
    from ..schedules import schedule_names
    from .planner import search

    every = tuple(schedule_names(searched=False))
    out = []
    for what, overlap, families in (("every family", True, every),
                                    ("every family, TP not overlapped", False, every),
                                    ("the source's families", True, None)):
        prof, req, hw = _setup(run, efficiency)
        hw = replace(hw, tp_overlap=overlap)
        mine = replace(run, hardware=(*run.hardware, ("tp_overlap", overlap)))
        req = replace(req, schedules=families or req.schedules)
        best = search(prof, req, hw, efficiency).plans[0]
        pub = predict_config(mine, efficiency)
        out.append({"what": what, "pick": best, "published": pub,
                    "margin": pub.step_time / best.step_time - 1})
    return out
