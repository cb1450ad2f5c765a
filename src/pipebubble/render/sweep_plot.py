"""The bubble sweep picture: bubble fraction and peak activation memory against m.

Left: the simulated bubble of each schedule (markers) and its closed form (a line in the same
colour) where one is known. Right: the peak activation memory on any rank. Together they show
the trade-off when tuning m: more microbatches, a smaller bubble; under GPipe, more memory.

>>> from pipebubble.plan.sweep import sweep
>>> fig = sweep_figure(sweep(["gpipe", "1f1b"], 4, [1, 2, 4, 8]), title="p=4")
>>> [ax.get_xlabel() for ax in fig.axes]
['microbatches m', 'microbatches m']
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from ..errors import UserError
from ..plan.sweep import MemoryPoint, SweepPoint
from .plots import WIDTH_IN, new_figure
from .style import schedule_color

MARKERS = "osD^vP*X"


def sweep_figure(points: Sequence[SweepPoint], title: str | None = None) -> Figure:
    """Two panels side by side, one series per schedule (in the order first seen)."""
    if not points:
        raise UserError("nothing to plot: the sweep has no points")
    names = list(dict.fromkeys(p.schedule for p in points))
    ncol = 4
    rows = -(-(len(names) + 1) // ncol)  # legend rows, the closed-form entry included
    height = 3.9 + 0.25 * rows
    fig = new_figure(WIDTH_IN, height)
    fig.subplots_adjust(left=0.07, right=0.985, top=1 - 0.75 / height,
                        bottom=(0.55 + 0.25 * rows) / height, wspace=0.2)
    bubble_ax, mem_ax = fig.subplots(1, 2)
    ms = sorted({p.microbatches for p in points})
    log_x = ms[-1] / ms[0] >= 8
    handles = []
    for k, name in enumerate(names):
        pts = sorted((p for p in points if p.schedule == name), key=lambda p: p.microbatches)
        color, marker = schedule_color(name), MARKERS[k % len(MARKERS)]
        x = [p.microbatches for p in pts]
        size = 4.5 if len(x) <= 40 else 3.0
        # Later schedules get smaller hollow markers so equal values stay visible.
        style = dict(color=color, marker=marker, linestyle="none",
                     markersize=max(2.5, size + 2 - 0.6 * k),
                     markerfacecolor="none" if k else color, markeredgewidth=1.1)
        bubble_ax.plot(x, [100 * p.bubble_fraction for p in pts], **style)
        closed = [(p.microbatches, p.closed_form_bubble) for p in pts
                  if p.closed_form_bubble is not None]
        if closed:
            bubble_ax.plot([c[0] for c in closed], [100 * c[1] for c in closed], color=color,
                           linewidth=1.2, alpha=0.8, zorder=1)
        mem_ax.plot(x, [p.peak_memory for p in pts], linewidth=0.9, alpha=0.6, color=color)
        mem_ax.plot(x, [p.peak_memory for p in pts], **style)
        v = pts[0].chunks
        label = name + (f" (v={v})" if v > 1 else "") + ", simulated"
        handles.append(Line2D([], [], **style, label=label))
    handles.append(Line2D([], [], color="#555555", linewidth=1.2,
                          label="closed form (line in the schedule's colour)"))
    if log_x and min(p.peak_memory for p in points) > 0:
        # log-log: GPipe's m microbatches is a straight line, 1F1B's p a flat one.
        mem_ax.set_yscale("log", base=2)
        mem_ax.yaxis.set_major_locator(LogLocator(base=2))
        mem_ax.yaxis.set_minor_locator(NullLocator())
        mem_ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    else:
        mem_ax.set_ylim(bottom=0)
    _bubble_axis(bubble_ax)
    mem_ax.set_ylabel("peak activation memory (× M_B)")
    mem_ax.set_title("peak activation memory on any rank", fontsize=10, loc="left")
    for ax in (bubble_ax, mem_ax):
        _plain_axes(ax, "microbatches m")
        if log_x:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(LogLocator(base=2))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ranks = points[0].ranks
    fig.suptitle(title or f"bubble and activation memory against microbatches, p={ranks}",
                 x=0.07, ha="left", fontsize=11, fontweight="bold")
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), ncol), frameon=False,
               fontsize=9, bbox_to_anchor=(0.5, 0.0))
    return fig


def memory_figure(points: Sequence[MemoryPoint], title: str | None = None) -> Figure:
    """Step time (left) and bubble (right) against the memory limit, one series per
    schedule, drawn only where the schedule fits: a hand-made schedule is a flat line from
    its own peak memory on; ``auto`` a staircase that falls as memory grows."""
    fitting = [p for p in points if p.fits]
    if not fitting:
        raise UserError("nothing to plot: no schedule fits any limit of the sweep")
    names = list(dict.fromkeys(p.schedule for p in points))
    height = 4.3
    fig = new_figure(WIDTH_IN, height)
    fig.subplots_adjust(left=0.07, right=0.985, top=1 - 0.75 / height, bottom=0.95 / height,
                        wspace=0.2)
    step_ax, bubble_ax = fig.subplots(1, 2)
    handles = []
    for k, name in enumerate(names):
        pts = sorted((p for p in fitting if p.schedule == name), key=lambda p: p.memory_limit)
        if not pts:
            continue
        searched = _searched(name)  # auto: drawn darker and wider
        color = "#111111" if searched else schedule_color(name)
        marker = MARKERS[k % len(MARKERS)]
        width = 2.2 if searched else 1.2
        x = [p.memory_limit for p in pts]
        style = dict(color=color, linewidth=width, drawstyle="steps-post")
        step_ax.plot(x, [p.step_time for p in pts], **style)
        bubble_ax.plot(x, [100 * p.bubble_fraction for p in pts], **style)
        first = pts[0]
        for ax, y in ((step_ax, first.step_time), (bubble_ax, 100 * first.bubble_fraction)):
            ax.plot([first.memory_limit], [y], marker=marker, color=color, markersize=5)
        v = first.chunks
        handles.append(Line2D([], [], color=color, linewidth=width, marker=marker,
                              label=name + (f" (v={v})" if v > 1 else "")))
    step_ax.set_ylabel("step time")
    step_ax.set_title("step time of what fits (lower is better)", fontsize=10, loc="left")
    _bubble_axis(bubble_ax)
    for ax in (step_ax, bubble_ax):
        _plain_axes(ax, "activation-memory limit per rank (× M_B)")
    ranks = points[0].ranks
    fig.suptitle(title or f"step time against the memory limit, p={ranks}", x=0.07, ha="left",
                 fontsize=11, fontweight="bold")
    step_ax.legend(handles=handles, loc="upper right", frameon=False, fontsize=8)
    return fig


def _bubble_axis(ax) -> None:
    """The bubble panel both sweeps draw: percent from 0, titled with its definition."""
    ax.set_ylabel("bubble fraction (%)")
    ax.set_ylim(bottom=0)
    ax.set_title("bubble: idle / (ranks × step time)", fontsize=10, loc="left")


def _plain_axes(ax, xlabel: str) -> None:
    """x label, a light grid, no top or right frame: every sweep panel."""
    ax.set_xlabel(xlabel)
    ax.grid(color="#e3e3e3", linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _searched(name: str) -> bool:
    """Whether ``name`` is a registered search over orders (``auto``)."""
    from ..ir.schedule import ScheduleError
    from ..schedules import lookup

    try:
        return lookup(name).searched
    except ScheduleError:
        return False
