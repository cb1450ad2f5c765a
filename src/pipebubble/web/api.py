"""The explorer's API: plain functions from request parameters to JSON-able objects.

The server (``server.py``) maps URLs to these functions and nothing else; every number the
page shows comes from here, and here from the same code as ``simulate --json``
(:func:`pipebubble.interop.timeline_json.simulate_json`). There is no second simulator in the page.

- ``GET /api/simulate?schedule=gpipe&ranks=4&microbatches=8&f=1&b=2`` → :func:`simulate_get`
- ``POST /api/simulate`` (a torch CSV or a timeline JSON body) → :func:`simulate_post`
- ``GET /api/sweep?...&ms=1,2,4`` → :func:`sweep` (bubble against m)
- ``GET /api/csv?...`` → :func:`schedule_csv`; ``GET|POST /api/trace`` → :func:`trace`
- ``GET /api/meta`` → :func:`meta` (schedules, colours, limits)

Parameters (all optional): ``schedule`` (gpipe), ``ranks`` (4), ``microbatches`` (8),
``chunks`` (the schedule's own), ``f`` (1), ``b`` (2), ``w`` (1; a number or a comma list
per stage, like the CLI), ``comm`` (0), ``overlap`` (1), ``mem_b`` (M_B, 1), ``mem_w``
(M_W, 0), ``memory_limit`` (none; one value, or one per rank). ``schedule=auto`` searches
an order under the memory limit, like ``simulate --schedule auto``. Bad values raise
``UserError`` with one line naming the value and what is valid; the server answers 400
with it, each parameter named by its flag as the CLI would (:func:`error_text`). Requests
bigger than :data:`MAX_ACTIONS` actions raise :class:`TooLarge` (413).

>>> out = simulate_get({"schedule": "gpipe", "ranks": "4", "microbatches": "8"})
>>> round(out["bubble_fraction"] * 100, 2)
27.27
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from .. import __version__
from ..costs import CostModel
from ..errors import UserError
from ..files import parse_json
from ..interop.timeline_json import (
    clean_floats,
    closed_form_for,
    simulate_checked,
    simulate_json,
    timeline_from_json,
    timeline_json,
)
from ..ir.schedule import Schedule
from ..limits import MAX_RANKS, MAX_REQUEST_ACTIONS, MAX_REQUEST_BYTES, estimate_actions
from ..params import PARAMS, parse_int, read
from ..schedules import FIRST, get_schedule, lookup, schedule_names
from ..timeline import Timeline

MAX_ACTIONS = MAX_REQUEST_ACTIONS  # actions per request (a sweep: summed over its points)
MAX_BODY_BYTES = MAX_REQUEST_BYTES  # bytes of a POSTed CSV or timeline JSON
MAX_SWEEP_POINTS = 64  # microbatch counts in one sweep
SWEEP_MS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULTS = {"schedule": FIRST, "ranks": "4", "microbatches": "8"}


def error_text(exc: UserError) -> str:
    """The answer's words for ``exc``: a parameter named by its flag (``--ranks must be >= 1,
    got 0``, the CLI's words for the same mistake), any other marked name as it is."""
    return exc.render(lambda name: PARAMS[name].flag if name in PARAMS else name)


class TooLarge(UserError):
    """The request asks for more than the documented limits; the server answers 413."""


def costs_from_params(params: Mapping[str, str]) -> CostModel:
    """The CostModel the parameters describe (the CLI's --f/--b/--w/--comm/--overlap,
    --a2a-f/--a2a-b and M_B, M_W, --memory-limit), each read and checked by
    :mod:`pipebubble.params`, the table the CLI's flags are read with. ``memory_limit``: one
    value for every rank, or one per rank; the page marks the ranks whose ``peak_memory``
    exceeds it."""
    return CostModel(
        f=read(params, "f"), b=read(params, "b"), w=read(params, "w"),
        comm=read(params, "comm"), overlap=read(params, "overlap"),
        a2a_f=read(params, "a2a_f"), a2a_b=read(params, "a2a_b"),
        activation_memory=read(params, "mem_b"), weight_memory=read(params, "mem_w"),
        memory_limit=read(params, "memory_limit"))


def _name(params: Mapping[str, str]) -> str:
    return str(params.get("schedule", DEFAULTS["schedule"]))


def schedule_from_params(params: Mapping[str, str], costs: CostModel | None = None,
                         search_share: float = 1.0) -> Schedule:
    """Generate the schedule the parameters name, refusing ones over :data:`MAX_ACTIONS`.

    ``auto`` (like ``simulate --schedule auto``) searches the fastest order for ``costs``
    within their memory limit: chunks 1 loop placement, 2 V, none either; with
    ``search_share`` of the command line's search budget (a sweep splits one budget over
    its points, so it costs about one search rather than one per point).
    """
    name = _name(params)
    ranks, microbatches = read(params, "ranks"), read(params, "microbatches")
    chunks = read(params, "chunks")
    spec = lookup(name)
    # a search (auto) may pick the V placement and splits every backward: 6 actions a rank
    chunks_at_most = 2 if spec.searched else chunks or spec.chunks
    _check_size(estimate_actions(ranks, microbatches, chunks_at_most), ranks)
    options: dict = {"costs": costs or CostModel()}
    if spec.searched and search_share != 1.0:
        from ..schedules.auto import SEARCH_SECONDS

        options["search_seconds"] = SEARCH_SECONDS * search_share
    schedule = get_schedule(spec.name, ranks, microbatches, chunks, **options)
    _check_size(sum(map(len, schedule.orders)))
    return schedule


def _check_size(actions: int, ranks: int = 1) -> None:
    if ranks > MAX_RANKS:
        raise TooLarge(f"{ranks:,} ranks is over the limit of {MAX_RANKS:,}")
    if actions > MAX_ACTIONS:
        raise TooLarge(f"{actions:,} actions is over the explorer's limit of {MAX_ACTIONS:,} "
                       "per request; use the command line (pipebubble simulate) for this size")


def simulate_get(params: Mapping[str, str]) -> dict:
    """``GET /api/simulate``: exactly the object ``pipebubble simulate --json`` prints."""
    costs = costs_from_params(params)
    return simulate_json(schedule_from_params(params, costs), costs)


def load_body(body: bytes, params: Mapping[str, str]) -> tuple[Timeline, dict]:
    """A POSTed file: a timeline JSON (``{...}``) or a torch.distributed.pipelining CSV.

    Returns the Timeline and its JSON object. A CSV is simulated with the cost parameters
    (no closed form: the file fixes the order); a timeline JSON keeps its own fields
    (``source``, ``predicted``, ``memory``, ...) over the recomputed ones, and a measured
    one gets ``predicted_timeline``: the simulator's prediction of the same run, from the
    run's own median action times (see :func:`_predict`), to draw beside it.
    """
    if len(body) > MAX_BODY_BYTES:
        raise TooLarge(f"the file is {len(body)} bytes; the explorer takes at most "
                       f"{MAX_BODY_BYTES} bytes")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError("the file is not UTF-8 text (expected a CSV or a JSON file)") from None
    name = str(params.get("name") or "uploaded")
    if not text.strip():
        raise UserError(f"{name}: the file is empty (expected a CSV or a JSON file)")
    if text.lstrip()[:1] in ("{", "["):  # JSON (a timeline is an object)
        data = parse_json(text, name)  # depth, digits, NaN/Infinity: as the CLI reads files
        if isinstance(data, dict) and isinstance(data.get("events"), list):
            _check_size(len(data["events"]))
        timeline = timeline_from_json(data, source=name)
        closed = data.get("closed_form_bubble")
        out = timeline_json(timeline, closed if _is_number(closed) else None,
                            basis=str(data.get("closed_form_basis") or "step"))
        for key, value in data.items():  # the file's own extras (measured runs: predicted)
            out.setdefault(key, value)
        if _memory_ok(data.get("memory"), timeline.num_ranks):  # events carry no memory:
            out["memory"] = data["memory"]  # keep the file's curves and peaks
        file_ranks = data.get("per_rank")
        if isinstance(file_ranks, list) and len(file_ranks) == len(out["per_rank"]):
            for mine, theirs in zip(out["per_rank"], file_ranks, strict=True):
                if isinstance(theirs, dict) and _is_number(theirs.get("peak_memory")):
                    mine["peak_memory"] = theirs["peak_memory"]
        out["source"] = timeline.source
        if timeline.source == "measured":
            predicted = _predict(timeline)
            if predicted is not None:
                out["predicted_timeline"] = predicted
        return timeline, clean_floats(out)  # as the CLI prints it
    from ..interop.torch_csv import parse_torch_csv

    _check_size(text.count(",") + text.count("\n") + 1)
    schedule = parse_torch_csv(text, source=name, name=name.rsplit(".", 1)[0])
    costs = costs_from_params(params)
    timeline = simulate_checked(schedule, costs)
    out = simulate_json(schedule, costs, closed_form=False, timeline=timeline)
    out["source"] = "simulated"
    return timeline, out


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x


def _memory_ok(memory: object, ranks: int) -> bool:
    """True when ``memory`` has the shape of :func:`~pipebubble.interop.timeline_json.memory_json`
    (one ``{rank, time, value}`` per rank, numbers, equal lengths): only then is a file's
    own curve passed to the page."""
    if not isinstance(memory, list) or len(memory) != ranks:
        return False
    for curve in memory:
        if not (isinstance(curve, dict) and isinstance(curve.get("time"), list)
                and isinstance(curve.get("value"), list)
                and len(curve["time"]) == len(curve["value"])
                and curve.get("rank") in range(ranks)
                and all(map(_is_number, curve["time"])) and all(map(_is_number, curve["value"]))):
            return False
    return True


def _predict(measured: Timeline) -> dict | None:
    """The simulator's prediction of a measured run: the same schedule (when its name is a
    registered one and the placement matches) under costs calibrated from the run's own
    median action times (:func:`pipebubble.plan.calibrate.costs_from_timeline`), in seconds
    like the run. None when the run's schedule cannot be regenerated."""
    from ..plan.calibrate import costs_from_timeline

    try:
        schedule = get_schedule(measured.schedule, measured.num_ranks,
                                measured.num_microbatches * measured.chains, measured.chunks)
    except ValueError:
        return None
    if tuple(schedule.stage_to_rank) != tuple(measured.stage_to_rank):
        return None
    out = simulate_json(schedule, costs_from_timeline(measured))
    out["source"] = "predicted"
    return out


def simulate_post(body: bytes, params: Mapping[str, str]) -> dict:
    """``POST /api/simulate``: a CSV or timeline file, viewed like a simulation."""
    return load_body(body, params)[1]


def sweep(params: Mapping[str, str]) -> dict:
    """``GET /api/sweep``: bubble and step time against m for one schedule and cost model.

    ``ms`` (a comma list) picks the microbatch counts; default :data:`SWEEP_MS` plus the
    current ``microbatches``. A count the schedule refuses (e.g. zb-h2 needs m >= 2p-1) gets
    ``error`` instead of numbers; when every count is refused, the request is bad (400).
    ``auto``'s points share one search budget (:func:`schedule_from_params`), so a point
    may be a little slower than the order ``/api/simulate`` finds at the same count.
    """
    costs = costs_from_params(params)
    current = read(params, "microbatches")
    if "ms" in params:
        parts = str(params["ms"]).split(",")
        if len(parts) > MAX_SWEEP_POINTS:
            raise TooLarge(f"ms has {len(parts)} values; a sweep takes at most "
                           f"{MAX_SWEEP_POINTS}")
        ms = sorted({parse_int(part, "ms") for part in parts})
    else:
        ms = sorted(set(SWEEP_MS) | {current})
    ranks = read(params, "ranks")
    name = _name(params)
    spec = lookup(name)
    chunks = read(params, "chunks") or (2 if spec.searched else spec.chunks)
    _check_size(sum(estimate_actions(ranks, m, chunks) for m in ms), ranks)
    points = []
    for m in ms:
        point: dict = {"microbatches": m}
        try:
            schedule = schedule_from_params({**params, "microbatches": str(m)}, costs,
                                            search_share=1 / len(ms))
            timeline = simulate_checked(schedule, costs)
        except TooLarge:
            raise
        except UserError as exc:
            point["error"] = error_text(exc)
        else:
            point.update(step_time=timeline.step_time, bubble_fraction=timeline.bubble_fraction,
                         closed_form_bubble=closed_form_for(schedule, costs))
        points.append(point)
    if all("error" in point for point in points):  # nothing to draw: the request is bad
        raise UserError(points[0]["error"])
    return clean_floats({"schedule": lookup(name).name, "ranks": ranks, "points": points})


def schedule_csv(params: Mapping[str, str]) -> str:
    """``GET /api/csv``: the schedule in torch.distributed.pipelining's CSV format."""
    from ..interop.torch_csv import to_torch_csv

    return to_torch_csv(schedule_from_params(params, costs_from_params(params)))


def trace(params: Mapping[str, str], body: bytes | None = None) -> dict:
    """``GET /api/trace`` (a simulation) or ``POST /api/trace`` (a loaded file): the
    Chrome/Perfetto trace document of :mod:`pipebubble.render.trace`."""
    from ..render.trace import trace_document

    if body is None:
        costs = costs_from_params(params)
        timeline = simulate_checked(schedule_from_params(params, costs), costs)
    else:
        timeline = load_body(body, params)[0]
    return trace_document([timeline], [timeline.schedule])


def meta() -> dict:
    """``GET /api/meta``: what the page builds its controls and colours from.

    Schedules come from the registry (every registered family, in registration order, then
    ``auto``), with their default and minimum chunks and a text for the closed form
    (``chunks`` null: the schedule chooses); colours are those of
    the PNG renderer (``render/style.py``), so the SVG and the PNG agree.
    """
    from ..render import style

    schedules = []
    for spec in map(lookup, schedule_names()):  # the families, then auto
        schedules.append({
            "name": spec.name, "summary": spec.summary, "formula": spec.formula or None,
            "chunks": None if spec.searched else spec.chunks, "min_chunks": spec.min_chunks,
            "fixed_chunks": spec.fixed_chunks, "split_backward": spec.split_backward,
            "closed_form": spec.closed_form is not None, "basis": spec.closed_form_basis,
            "color": style.schedule_color(spec.name),
        })
    return {
        "version": __version__, "defaults": DEFAULTS, "schedules": schedules,
        "colors": {"kinds": style.KIND_COLORS, "fallback": style.FALLBACK_KIND,
                   "idle": style.IDLE_COLOR, "overlap_edge": style.OVERLAP_EDGE,
                   "chunk_darkening": style.CHUNK_DARKENING},
        "kind_names": style.KIND_NAMES,
        "limits": {"max_actions": MAX_ACTIONS, "max_body_bytes": MAX_BODY_BYTES},
    }


# ---- the first paint -----------------------------------------------------------------------
FIRST_VIEW = {"schedule": DEFAULTS["schedule"], "ranks": DEFAULTS["ranks"],
              "microbatches": DEFAULTS["microbatches"], "f": "1", "b": "2", "w": "1",
              "comm": "0", "overlap": "1", "mem_b": "1", "mem_w": "0"}
"""The view the page opens on: app.js's defaults (its PARAMS), in its query's order."""
INITIAL_SLOT = b'<script id="initial" type="application/json"></script>'


def initial_view() -> dict:
    """What the page draws before it has asked for anything: the metadata, and the first
    view's simulation and sweep, each exactly as ``/api/meta``, ``/api/simulate`` and
    ``/api/sweep`` answer them. ``query`` is that view's query string; app.js draws these
    only when its own first query is the same (a link with another view in its ``#...`` waits
    for its own answer)."""
    from urllib.parse import urlencode

    return {"query": urlencode(FIRST_VIEW), "name": FIRST_VIEW["schedule"], "meta": meta(),
            "simulation": simulate_get(FIRST_VIEW), "sweep": sweep(FIRST_VIEW)}


def index_page(html: bytes) -> bytes:
    """The page with :func:`initial_view` inlined in its ``<script id="initial">`` slot, so
    its first paint shows a schedule instead of an empty frame waiting for two requests.
    ``</`` is escaped so that no value can close the script element."""
    if INITIAL_SLOT not in html:
        return html
    data = json.dumps(initial_view(), allow_nan=False).replace("</", "<\\/")
    return html.replace(INITIAL_SLOT, INITIAL_SLOT.replace(b"></", b">" + data.encode() + b"</"))
