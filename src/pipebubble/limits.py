"""Documented limits on the work one command may ask for, checked before the work starts.

A typo such as ``-p 1000000000`` or ``-m 1..100000`` must not allocate for minutes and then
die; it is refused up front with one line naming the limit and the flag that raises it.

- actions of one schedule (about 3·p·v·m: F, I, W per stage and microbatch): at most
  :data:`MAX_ACTIONS` = 2 000 000; ``--max-actions N`` raises it;
- ranks of one schedule: at most :data:`MAX_RANKS` = 100 000 (unless ``--max-actions`` is
  raised);
- a sweep: actions summed over every (schedule, m) at most :data:`MAX_SWEEP_ACTIONS` =
  20 000 000, or 10 x ``--max-actions``;
- chart widths (``--width``, ``--chart-width``): 1..:data:`MAX_WIDTH` = 10 000 columns;
- a built-in model's weights and gradients (16 bytes per parameter) must fit the machine's
  free memory (lower ``--layers`` or ``--width``);
- ``--threads``: at most the CPU cores this process may use;
- ``--max-actions`` itself: at most :data:`HARD_MAX_ACTIONS` = 200 000 000, and no more than
  the machine's free memory holds at :data:`BYTES_PER_ACTION` each;
- layers of a model or profile: at most :data:`MAX_LAYERS` = 100 000 (partitioning is
  O(layers x stages); ``profile`` refuses to write more than ``partition`` reads);
- the planner: ``--gpus`` at most :data:`MAX_GPUS` = 2^20 (its divisors are found in
  O(sqrt N), :func:`divisors`), ``--global-batch`` at most :data:`MAX_GLOBAL_BATCH` = 2^30,
  and a pipeline of at most :data:`MAX_PLAN_MICROBATCHES` = 4 096 microbatches per step
  (so no configuration's simulation is linear in the global batch);
  ``--max-chunks`` at most :data:`MAX_CHUNKS`; ``--exhaustive-cuts`` at most
  :data:`MAX_EXHAUSTIVE_CUTS`; ``--validate`` at most :data:`MAX_VALIDATE` plans,
  ``--target-step`` at most :data:`MAX_TARGET_STEP` s and all the validation runs' steps
  at most :data:`MAX_VALIDATION_SECONDS` in all;
- processes of one machine's run: at most :data:`PROCESSES_PER_CORE` per CPU core
  (``--allow-oversubscribe`` lifts that), and never more than the free memory holds at
  :data:`BYTES_PER_PROCESS` each;
- a comma list flag: at most :data:`MAX_LIST_ITEMS` items, none of them empty;
- a HuggingFace ``config.json`` (``--hf-config``, ``hf:PATH``), every size key before
  anything is built: layers at most :data:`MAX_LAYERS` - 2 (the embedding and the head are
  layers of the profile too), hidden size and head size at most :data:`MAX_HF_HIDDEN`,
  MLP size at most :data:`MAX_HF_FFN`, vocabulary at most :data:`MAX_HF_VOCAB`, heads at
  most :data:`MAX_HF_HEADS`, positions and sliding window at most
  :data:`MAX_HF_POSITIONS`; a model built from one must fit the free memory at
  :data:`BYTES_PER_PARAM_RUN` per parameter (:func:`check_params_fit`).

A bounded search never does work linear in an unbounded input: every count above is checked
before it is used as a loop bound, and integer flags have at most 30 digits (``int_flag``).

A simulated timeline costs about 400 bytes per action (1F1B, p=16, m=50 000: 1.6 million
actions, 640 MB resident), so the default of 2 million actions stays under a GiB; a sweep's
timelines are small and freed one by one, so its limit bounds time, not memory.

>>> estimate_actions(ranks=4, microbatches=8, chunks=1)
96
>>> check_actions(ranks=10**9, microbatches=1)
Traceback (most recent call last):
...
pipebubble.limits.LimitError: -p 1000000000 x -m 1 x -v 1 makes about 3,000,000,000 actions, \
over the limit of 2,000,000; use fewer or raise max_actions
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from .errors import param
from .ir.schedule import ScheduleError

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_ALLOW_OVERSUBSCRIBE = param("allow_oversubscribe")
_BATCH = param("batch")
_GLOBAL_BATCH = param("global_batch")
_GPUS = param("gpus")
_LAYERS = param("layers")
_LOCAL = param("local")
_MAX_ACTIONS = param("max_actions")
_MICROBATCH_SIZE = param("microbatch_size")
_SEQ = param("seq")
_TARGET_STEP = param("target_step")
_VALIDATE = param("validate")
_VOCAB = param("vocab")
_WIDTH = param("width")

MAX_ACTIONS = 2_000_000
MAX_SWEEP_ACTIONS = 20_000_000
MAX_RANKS = 100_000
MAX_WIDTH = 10_000
BYTES_PER_PARAM_RUN = 16  # float32 weight + gradient + room for activations and the copy
HARD_MAX_ACTIONS = 200_000_000
BYTES_PER_ACTION = 400  # a simulated timeline's resident memory per action (module doc)
MAX_LAYERS = 100_000
MAX_GPUS = 1 << 20
MAX_GLOBAL_BATCH = 1 << 30
MAX_PLAN_MICROBATCHES = 4096
MAX_EXHAUSTIVE_CUTS = 100_000
MAX_CHUNKS = 64
MAX_VALIDATE = 16
MAX_JOBS = 256  # plan --jobs: worker processes of the search
MAX_TARGET_STEP = 60.0
MAX_VALIDATION_SECONDS = 1800.0
PROCESSES_PER_CORE = 4
BYTES_PER_PROCESS = 70 * 2**20  # one worker: interpreter, torch, gloo (measured: ~70 MB RSS)
MAX_LIST_ITEMS = 64
MAX_REQUEST_ACTIONS = 200_000
MAX_DATA_BYTES = 256 * 2**20  # a run --data token file (.npy/.bin): 128 M uint16 tokens
"""Actions one explorer request may simulate (a sweep: summed over its points): the page
answers in well under a second at this size, and one client cannot hold the server."""
MAX_REQUEST_BYTES = 8 * 2**20
"""Bytes of one POSTed CSV or timeline JSON to the explorer."""
MAX_HF_HIDDEN = 1 << 18
"""Largest hidden (or head) size of a HuggingFace config: 262,144, 16x the largest public
dense model's (Llama-3.1-405B: 16,384)."""
MAX_HF_FFN = 1 << 20
"""Largest MLP inner size of a HuggingFace config (Llama-3.1-405B: 53,248)."""
MAX_HF_VOCAB = 1 << 22
"""Largest vocabulary of a HuggingFace config: 4,194,304 (Gemma: 262,144)."""
MAX_HF_HEADS = 1 << 14
"""Most attention heads of a HuggingFace config (Llama-3.1-405B: 128)."""
MAX_HF_POSITIONS = 1 << 24
"""Most positions (and the widest sliding window) of a HuggingFace config: 16,777,216
(Llama 4 Scout: 10 million)."""
MIN_TIME, MAX_TIME = 1e-12, 1e12
"""A time (a flag, a profile's field) is 0 or in [MIN_TIME, MAX_TIME]: below, sums and ratios
underflow (5e-324 becomes 0 in a division and NaN in a chart); above, m x (F + B) overflows."""


class LimitError(ScheduleError):
    """A request above a documented limit; the message names the limit and the parameter."""


def estimate_actions(ranks: int, microbatches: int, chunks: int | None = 1,
                     name: str | None = None) -> int:
    """An upper bound on the compute actions of a schedule: F, I and W for every stage
    (``ranks x chunks``) and microbatch. ``name`` supplies the schedule's default chunks."""
    if chunks is None:
        chunks = 1
        if name is not None:
            from .schedules import lookup

            try:
                chunks = lookup(name).chunks
            except ScheduleError:
                chunks = 1
    return 3 * ranks * max(chunks, 1) * microbatches


def check_actions(ranks: int, microbatches: int, chunks: int | None = 1,
                  name: str | None = None, limit: int | None = None) -> int:
    """Refuse a schedule larger than ``limit`` actions (default :data:`MAX_ACTIONS`) or with
    more than :data:`MAX_RANKS` ranks; return the estimate."""
    limit = MAX_ACTIONS if limit is None else check_max_actions(limit)
    n = estimate_actions(ranks, microbatches, chunks, name)
    v = chunks if chunks is not None else n // (3 * ranks * microbatches)
    if n > limit:
        raise LimitError(f"-p {ranks} x -m {microbatches} x -v {v} makes about {n:,} actions, "
                         f"over the limit of {limit:,}; use fewer or raise {_MAX_ACTIONS}")
    if ranks > MAX_RANKS and limit <= MAX_ACTIONS:
        raise LimitError(f"-p {ranks} is over the limit of {MAX_RANKS:,} ranks; use fewer or "
                         f"raise {_MAX_ACTIONS}")
    return n


def check_sweep(names: Iterable[str], ranks: int, microbatches: Iterable[int],
                chunks: int | None = None, limit: int | None = None) -> int:
    """Refuse a sweep whose actions summed over every (schedule, m) exceed ``limit``
    (default :data:`MAX_SWEEP_ACTIONS`); return the total. Counting work rather than points
    is what makes ``-m 1..100000`` (5·10⁹ actions at p=4) fail fast."""
    limit = MAX_SWEEP_ACTIONS if limit is None else check_max_actions(limit)
    m_total = sum(microbatches)  # the estimate is linear in m
    total = sum(estimate_actions(ranks, m_total, chunks, name) for name in names)
    if total > limit:
        raise LimitError(f"this sweep simulates about {total:,} actions in all, over the limit "
                         f"of {limit:,}; sweep fewer microbatch counts (e.g. -m 1..256:8) or "
                         f"raise {_MAX_ACTIONS}")
    return total


def check_width(value: int, name: str = "width") -> int:
    """A chart width in columns: 1..:data:`MAX_WIDTH`."""
    if not 1 <= value <= MAX_WIDTH:
        raise LimitError(f"{param(name)} must be between 1 and {MAX_WIDTH} columns, got {value}")
    return value


def check_threads(threads: int, name: str = "threads") -> int:
    """At most one thread per CPU core this process may use (more only slows torch down,
    and tens of thousands crash its thread pool)."""
    cores = available_cores()
    if threads > cores:
        raise LimitError(f"{param(name)} {threads} is more than the {cores} CPU cores this "
                         f"has; use at most {cores}")
    return threads


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def machine_load() -> float | None:
    """This machine's 1-minute load average (runnable processes), or None where the system
    has none (``os.getloadavg`` is POSIX)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_words(load: float | None, cores: int, processes: int, real: bool) -> tuple[str, bool]:
    """(the machine's load in words, whether it explains a miss). The load explains it when
    the 1-minute load average is above the cores (other work held them), or, for a real model
    (its ranks compute; sleeping ranks do not), when the run had more processes than cores.

    >>> load_words(5.2, 2, 4, True)
    ('load average 5.2 on 2 cores (2.6 per core), 4 processes (2 per core)', True)
    >>> load_words(0.5, 4, 2, True)[1], load_words(0.5, 2, 8, False)[1]
    (False, False)
    """
    per = processes / max(cores, 1)
    text = (f"load average {load:.2g} on {cores} cores ({load / max(cores, 1):.2g} per core)"
            if load is not None else f"no load average on {cores} cores")
    text += f", {processes} process{'' if processes == 1 else 'es'} ({per:.2g} per core)"
    busy = (load is not None and load > cores) or (real and processes > cores)
    return text, busy


def free_memory_bytes() -> int | None:
    """Memory the machine can still give (``MemAvailable`` in /proc/meminfo), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def model_params(model: str, layers: int, width: int | None = None, vocab: int = 4096,
                 seq: int = 32) -> int:
    """Parameters of a built-in model (see :mod:`pipebubble.models`), without building it.

    mlp: ``layers`` Linear(width, width) blocks: layers·(w² + w). transformer: embedding
    (vocab·d + seq·d), per block 12·d² + 13·d (attention 4·d² + 4·d, MLP 8·d² + 5·d, two
    LayerNorms 4·d), and a head (LayerNorm 2·d, projection d·vocab + vocab). sleep: a
    width-by-width Linear per layer. Checked against torch's count in tests/test_files.py.

    >>> model_params("mlp", 2, 3)
    24
    """
    if model == "transformer":
        d = width or 64
        return vocab * d + seq * d + layers * (12 * d * d + 13 * d) + 2 * d + d * vocab + vocab
    if model == "moe":  # as transformer, the MLP 4 experts + 1 shared of 3·d·2d, router 4·d
        d = width or 32
        return vocab * d + seq * d + layers * (34 * d * d + 12 * d) + 2 * d + d * vocab + vocab
    w = width or (256 if model == "mlp" else 8)
    return layers * (w * w + w)


def activation_bytes(model: str, layers: int, width: int | None = None, vocab: int = 4096,
                     seq: int = 32, batch: int = 1) -> int:
    """A rough upper estimate of what one step of ``batch`` samples keeps for the backward
    (float32): mlp and sleep 2 tensors of batch x width per layer; transformer about 16
    tensors of batch x seq x dim per block plus the logits (batch x seq x vocab, twice).

    >>> activation_bytes("mlp", 2, 4, batch=8)
    512
    """
    if model in ("transformer", "moe"):
        d = width or (64 if model == "transformer" else 32)
        return 4 * batch * seq * ((16 if model == "transformer" else 40) * d * layers
                                  + 2 * vocab)
    w = width or (256 if model == "mlp" else 8)
    return 4 * batch * w * 2 * max(1, layers)


def check_model_size(model: str, layers: int, width: int | None = None, vocab: int = 4096,
                     seq: int = 32, processes: int = 1, batch: int = 0) -> int:
    """Refuse a model whose weights and gradients (``BYTES_PER_PARAM_RUN`` bytes per
    parameter, ``processes`` copies), plus the activations of a ``batch``, exceed the
    machine's free memory; return the bytes."""
    weights = model_params(model, layers, width, vocab, seq) * BYTES_PER_PARAM_RUN * processes
    acts = activation_bytes(model, layers, width, vocab, seq, batch) if batch else 0
    free = free_memory_bytes()
    if free is not None and weights > free:
        flags = f"{_LAYERS} {layers}" + (f", {_WIDTH} {width}" if width else "")
        if model in ("transformer", "moe"):
            flags += f", {_VOCAB} {vocab}, {_SEQ} {seq}"
        raise LimitError(f"the {model} of {flags} needs about {weights / 2**30:.1f} GiB for "
                         f"weights and gradients, more than the {free / 2**30:.1f} GiB free "
                         "here; make it smaller")
    if free is not None and weights + acts > free:
        raise LimitError(f"{_BATCH} {batch} needs about {acts / 2**30:.1f} GiB of activations "
                         f"for this {model}, more than the {free / 2**30:.1f} GiB free here; "
                         f"use a smaller {_BATCH}")
    return weights + acts


def check_params_fit(params: int, what: str, bytes_per_param: int = BYTES_PER_PARAM_RUN) -> int:
    """Refuse building a model of ``params`` parameters whose weights and gradients
    (``bytes_per_param`` each) exceed the machine's free memory, before anything is
    allocated; return the bytes. ``what`` names the model (``hf:PATH``) in the message.

    >>> check_params_fit(10, "hf:tiny")
    160
    """
    need = params * bytes_per_param
    free = free_memory_bytes()
    if free is not None and need > free:
        raise LimitError(f"{what}: {params:,} parameters need about {need / 2**30:,.1f} GiB "
                         f"for weights and gradients, more than the {free / 2**30:.1f} GiB "
                         "free here; make the model smaller (fewer layers, a smaller hidden "
                         "size or vocabulary)")
    return need


# ---- the bounds added in round 3 (one place for the CLI, the explorer and the library) ----
def check_count(value: int, name: str, lo: int = 1, hi: int | None = None) -> int:
    """An integer count in ``lo..hi``: the message names the parameter and the range.

    >>> check_count(3, "--validate", 0, 16)
    3
    >>> check_count(10**400, "--validate", 0, 16)
    Traceback (most recent call last):
    ...
    pipebubble.limits.LimitError: --validate must be an integer in 0..16, got a 401-digit number
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitError(f"{param(name)} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        shown = f"a {len(str(abs(value)))}-digit number" if abs(value) >= 10**30 else value
        where = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise LimitError(f"{param(name)} must be an integer {where}, got {shown}")
    return value


def check_max_actions(limit: int, name: str = "max_actions") -> int:
    """A raised action limit: at most :data:`HARD_MAX_ACTIONS`, and what free memory holds
    at :data:`BYTES_PER_ACTION` per action (a 3e12-action request never reaches numpy)."""
    check_count(limit, name, 1, HARD_MAX_ACTIONS)
    free = free_memory_bytes()
    if free is not None and limit > max(MAX_ACTIONS, free // BYTES_PER_ACTION):
        raise LimitError(f"{param(name)} {limit:,} would need about "
                         f"{limit * BYTES_PER_ACTION / 2**30:.1f} GiB, more than the "
                         f"{free / 2**30:.1f} GiB free here; use at most "
                         f"{max(MAX_ACTIONS, free // BYTES_PER_ACTION):,}")
    return limit


def check_layers(layers: int, name: str = "layers") -> int:
    """At most :data:`MAX_LAYERS` layers (a model built, profiled or partitioned)."""
    return check_count(layers, name, 1, MAX_LAYERS)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` (1 <= n <= :data:`MAX_GPUS`), ascending, in O(sqrt n) steps.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    check_count(n, "gpus", 1, MAX_GPUS)
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def check_plan(gpus: int, global_batch: int, microbatch_sizes: Iterable[int]) -> None:
    """The planner's request: ``--gpus`` and ``--global-batch`` within their limits, and at
    least one (dp, microbatch size) that gives a pipeline of at most
    :data:`MAX_PLAN_MICROBATCHES` microbatches (the planner skips the others)."""
    check_count(gpus, "gpus", 1, MAX_GPUS)
    check_count(global_batch, "global_batch", 1, MAX_GLOBAL_BATCH)
    sizes = list(microbatch_sizes)
    if len(sizes) > MAX_LIST_ITEMS:
        raise LimitError(f"{_MICROBATCH_SIZE} lists {len(sizes)} sizes, over the limit of "
                         f"{MAX_LIST_ITEMS}")
    for s in sizes:
        check_count(s, "microbatch_size", 1, MAX_GLOBAL_BATCH)
    fewest = min((global_batch // (dp * s) for dp in divisors(gpus) for s in sizes
                  if global_batch % (dp * s) == 0), default=None)
    if fewest is not None and fewest > MAX_PLAN_MICROBATCHES:
        raise LimitError(f"{_GLOBAL_BATCH} {global_batch} makes at least {fewest:,} microbatches "
                         f"per pipeline with {_GPUS} {gpus} and {_MICROBATCH_SIZE} "
                         f"{','.join(map(str, sizes))}; the planner simulates at most "
                         f"{MAX_PLAN_MICROBATCHES:,}: use larger microbatch sizes")


def plan_microbatches_ok(microbatches: int) -> bool:
    """Whether the planner simulates a configuration of this many microbatches."""
    return microbatches <= MAX_PLAN_MICROBATCHES


def check_validation(plans: int, target_step: float, steps_per_plan: int = 6) -> float:
    """``plan --validate K --target-step S``: K <= :data:`MAX_VALIDATE`, 0 < S <=
    :data:`MAX_TARGET_STEP`, and K runs of ``steps_per_plan`` steps (warm-up included) of
    about S seconds each at most :data:`MAX_VALIDATION_SECONDS` in all; returns that
    estimate in seconds."""
    check_count(plans, "validate", 0, MAX_VALIDATE)
    if not (0 < target_step <= MAX_TARGET_STEP):  # also refuses nan
        raise LimitError(f"{_TARGET_STEP} must be > 0 and at most {MAX_TARGET_STEP:g} seconds, "
                         f"got {target_step!r}")
    total = plans * steps_per_plan * target_step
    if total > MAX_VALIDATION_SECONDS:
        raise LimitError(f"{_VALIDATE} {plans} x {_TARGET_STEP} {target_step:g} s runs about "
                         f"{total:,.0f} s of steps, over the limit of "
                         f"{MAX_VALIDATION_SECONDS:,.0f} s; validate fewer plans or use a "
                         f"shorter {_TARGET_STEP}")
    return total


def check_processes(processes: int, allow_oversubscribe: bool = False,
                    name: str | None = None) -> int:
    """Processes one machine's run starts: at most :data:`PROCESSES_PER_CORE` per core
    (unless ``allow_oversubscribe``), and never more than free memory holds at
    :data:`BYTES_PER_PROCESS` each. ``name``: what set the count (default: ranks x dp)."""
    name = f"-p x {param('dp')}" if name is None else name
    cores = available_cores()
    if processes > PROCESSES_PER_CORE * cores and not allow_oversubscribe:
        raise LimitError(f"{name} starts {processes:,} processes, over "
                         f"{PROCESSES_PER_CORE} per CPU core ({PROCESSES_PER_CORE * cores} "
                         f"on the {cores} cores here); use fewer, {_LOCAL}, or "
                         f"{_ALLOW_OVERSUBSCRIBE}")
    free = free_memory_bytes()
    if free is not None and processes * BYTES_PER_PROCESS > free:
        raise LimitError(f"{name} starts {processes:,} processes of about "
                         f"{BYTES_PER_PROCESS // 2**20} MiB each, more than the "
                         f"{free / 2**30:.1f} GiB free here; use at most "
                         f"{max(1, free // BYTES_PER_PROCESS):,} (or {_LOCAL})")
    return processes


def split_list(text: str, name: str, max_items: int = MAX_LIST_ITEMS) -> list[str]:
    """The items of a comma list flag, stripped: an empty item (``1,,2``, a trailing comma)
    is an error, not skipped, and there are at most ``max_items``.

    >>> split_list("gpipe, 1f1b", "--schedules")
    ['gpipe', '1f1b']
    >>> split_list("gpipe,,1f1b", "--schedules")
    Traceback (most recent call last):
    ...
    pipebubble.limits.LimitError: --schedules 'gpipe,,1f1b': item 2 is empty; give a comma \
list without empty items, like a,b
    """
    items = [t.strip() for t in text.split(",")]
    if len(items) > max_items:
        raise LimitError(f"{param(name)} lists {len(items):,} items, over the limit of {max_items}")
    for k, item in enumerate(items):
        if not item:
            raise LimitError(f"{param(name)} {text[:60]!r}: item {k + 1} is empty; give a comma "
                             "list without empty items, like a,b")
    return items

# ---- numbers in flags and in the explorer's query (read by pipebubble.params) ----------------
MAX_INT_DIGITS = 18
"""Longest integer a flag or query parameter accepts (digits): ints are parsed only after
this check, so a 4300-digit number is one line of error, never Python's own conversion limit."""

MAX_TIME_VALUES = 1_000_000
"""Most values in one comma list of per-stage times."""


def check_time(value: object, name: str) -> float:
    """A time (a cost flag, an explorer parameter, a profile's field): a finite number, 0 or
    in [:data:`MIN_TIME`, :data:`MAX_TIME`]. The same rule for the CLI and the explorer.

    >>> check_time(0.5, "--f")
    0.5
    >>> check_time(1e-300, "f")
    Traceback (most recent call last):
    ...
    pipebubble.limits.LimitError: f must be 0 or between 1e-12 and 1e+12, got 1e-300
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LimitError(f"{param(name)} must be a number, got {value!r}")
    v = float(value)
    if not v >= 0 or v == float("inf"):
        raise LimitError(f"{param(name)} must be finite and >= 0, got {v:g}")
    if not (v == 0 or MIN_TIME <= v <= MAX_TIME):
        raise LimitError(f"{param(name)} must be 0 or between {MIN_TIME:g} and {MAX_TIME:g}, "
                         f"got {v:g}")
    return v


# ---- a model's input (``--input-shape``) ----------------------------------------------------
MAX_SAMPLE_ELEMENTS = 1 << 24
"""Elements of one input sample of an ``nn.Sequential`` (``--input-shape``): 16 Mi (64 MiB in
float32); a batch holds 8 per microbatch of them, so a typo such as ``100000,100000`` is refused
before torch tries to allocate terabytes."""


def check_input_shape(dims: Iterable[int], name: str = "input_shape") -> tuple[int, ...]:
    """One sample's shape: at most :data:`MAX_SAMPLE_ELEMENTS` elements and 8 dimensions.

    >>> check_input_shape((3, 32, 32))
    (3, 32, 32)
    >>> check_input_shape((100000, 100000))
    Traceback (most recent call last):
    ...
    pipebubble.limits.LimitError: input_shape 100000,100000 is 10,000,000,000 elements per \
sample, over the limit of 16,777,216; use a smaller shape
    """
    dims = tuple(dims)
    if len(dims) > 8:
        raise LimitError(f"{param(name)} has {len(dims)} dimensions; at most 8")
    total = 1
    for d in dims:
        total *= d
    if total > MAX_SAMPLE_ELEMENTS:
        shown = ",".join(str(d) if d < 10**18 else "(huge)" for d in dims)
        count = f"{total:,}" if total < 10**30 else "over 10^30"
        raise LimitError(f"{param(name)} {shown[:80]} is {count} elements per sample, over the "
                         f"limit of {MAX_SAMPLE_ELEMENTS:,}; use a smaller shape")
    return dims
