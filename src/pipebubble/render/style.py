"""Colours, units and sizes shared by every picture, so figures agree with each other.

- Kinds keep one colour everywhere (Paul Tol's colour-blind-safe "vibrant" set, close to the
  terminal chart's): F blue, I cyan, W green, B orange. A rank's later chunks are darker
  shades of the same colour, as in the terminal chart.
- Schedules keep one colour everywhere (sweeps, comparisons), known names first.
- Time: measured timelines are in seconds and are shown in s, ms or µs; simulated ones are
  in the cost model's own units (F = 1 means "one forward of one rank's share").

>>> text_color(kind_color("F"))
'white'
>>> time_scale([1e-3], measured=True)
(1000.0, 'ms')
"""

from __future__ import annotations

from collections.abc import Sequence

from ..timeline import Timeline

KIND_COLORS = {"F": "#0077BB", "I": "#33BBEE", "W": "#009988", "B": "#EE7733"}
KIND_ORDER = "FIWB"
KIND_NAMES = {"F": "forward", "I": "backward, input (I)", "W": "backward, weights (W)",
              "B": "backward (B = I + W)"}
FALLBACK_KIND = "#AA3377"
IDLE_COLOR = "#EDEDED"
OVERLAP_EDGE = "#000000"
MEMORY_CMAP = "viridis"
A2A_HIDDEN = "#F4C2C2"  # all-to-all hidden behind a pair's compute (light, hatched)
A2A_EXPOSED = "#B2182B"  # all-to-all the rank waits for (dark red)
CHUNK_DARKENING = 0.45  # a rank's last chunk is drawn at 1 - 0.45 of its kind's colour

# A registered schedule keeps its spec's colour (ScheduleSpec.color); others, one of these.
_SPARE = ["#555555", "#997700", "#6699CC", "#117733", "#999933", "#44AA99", "#DDAA33"]


def kind_color(kind: str, chunk: int = 0, chunks: int = 1) -> tuple[float, float, float]:
    """RGB of a box: the kind's colour, darkened for later chunks (up to 45% at the last).

    The explorer's page (``web/static/app.js``) applies the same rule to the same colours.
    """
    from matplotlib.colors import to_rgb  # lazily: the trace writer and the web server use
    # this module's colours and must not load matplotlib

    r, g, b = to_rgb(KIND_COLORS.get(kind, FALLBACK_KIND))
    if chunks > 1 and chunk > 0:
        k = 1.0 - CHUNK_DARKENING * chunk / (chunks - 1)
        r, g, b = r * k, g * k, b * k
    return (r, g, b)


def text_color(rgb: Sequence[float]) -> str:
    """Black or white, whichever reads better on ``rgb`` (relative luminance threshold)."""
    r, g, b = rgb[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def schedule_color(name: str) -> str:
    """A stable colour per schedule name, the same in every figure: the registered spec's
    ``color``, else a spare one chosen by the name."""
    from ..ir.schedule import ScheduleError
    from ..schedules import lookup

    key = name.lower()
    try:
        spec = lookup(key)
    except ScheduleError:
        spec = None
    if spec is not None and spec.color:
        return spec.color
    return _SPARE[sum(map(ord, key)) % len(_SPARE)]


def is_measured(timelines: Sequence[Timeline]) -> bool:
    """True when any timeline is measured: then all are taken to be in seconds."""
    return any(t.source == "measured" for t in timelines)


def time_scale(spans: Sequence[float], measured: bool) -> tuple[float, str]:
    """(factor, unit) to display times: seconds become s, ms or µs; model units stay."""
    if not measured:
        return 1.0, "units"
    longest = max(spans, default=1.0)
    if longest >= 1.0:
        return 1.0, "s"
    if longest >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def timeline_time_scale(timelines: Sequence[Timeline]) -> tuple[float, str]:
    return time_scale([t.step_time for t in timelines], is_measured(timelines))


def memory_scale(timeline: Timeline, peak: float) -> tuple[float, str]:
    """(factor, label) for activation memory: bytes for measured runs, else M_B units."""
    if timeline.source != "measured":
        return 1.0, "activation memory\n(× M_B)"
    for factor, unit in ((2.0**-30, "GiB"), (2.0**-20, "MiB"), (2.0**-10, "KiB")):
        if peak * factor >= 1.0:
            return factor, f"activation memory\n({unit})"
    return 1.0, "activation memory\n(bytes)"


def describe(timeline: Timeline) -> str:
    """``1f1b  p=4 m=8 v=1``: what the timeline ran (m over all chains: DualPipe's total)."""
    m = timeline.num_microbatches * timeline.chains
    return f"{timeline.schedule}  p={timeline.num_ranks} m={m} v={timeline.chunks}"


def headline(timeline: Timeline, factor: float, unit: str) -> str:
    """``step time 33 units · bubble 27.27%``: the figures a title carries."""
    return (f"step time {timeline.step_time * factor:.4g} {unit} · "
            f"bubble {timeline.bubble_fraction:.2%}")


def a2a_spans(start: float, end: float, hidden: float, exposed: float
              ) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """Where an action's all-to-all is drawn inside its box: the hidden part from its start,
    the exposed part up to its end (what the rank waits for comes last, after the compute),
    both shrunk in proportion when together they outlast the box (``--overlap`` < 1 scales
    a pair's time but not its all-to-all). None where there is none.

    >>> a2a_spans(0.0, 4.0, 1.0, 0.5)
    ((0.0, 1.0), (3.5, 4.0))
    """
    total = hidden + exposed
    k = min(1.0, (end - start) / total) if total > 0 else 0.0
    return ((start, start + hidden * k) if hidden > 0 else None,
            (end - exposed * k, end) if exposed > 0 else None)
