"""Chrome/Perfetto traces: every event carries the fields its phase requires (Trace Event
Format), and slices, flows and counters match the Timeline one for one."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from pipebubble import CostModel, Pipeline, PipelineStage, get_schedule, simulate
from pipebubble.render.trace import trace_document, write_trace
from render_cases import hand_built

# Required fields per phase, from the Trace Event Format document (Duration/Complete,
# Counter, Flow and Metadata events).
REQUIRED = {
    "X": {"name", "cat", "ph", "ts", "dur", "pid", "tid"},
    "C": {"name", "ph", "ts", "pid", "args"},
    "s": {"name", "cat", "ph", "id", "ts", "pid", "tid"},
    "f": {"name", "cat", "ph", "id", "ts", "pid", "tid", "bp"},
    "M": {"name", "ph", "pid", "args"},
}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_format(doc: dict) -> list[dict]:
    """Validate the whole document; return its events."""
    assert set(doc) >= {"traceEvents", "displayTimeUnit"}
    assert doc["displayTimeUnit"] in ("ms", "ns")
    json.dumps(doc)  # plain JSON values only
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in REQUIRED, e
        missing = REQUIRED[e["ph"]] - set(e)
        assert not missing, (missing, e)
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if e["ph"] != "M":
            assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
        if e["ph"] == "C":
            assert all(isinstance(v, int | float) for v in e["args"].values())
        if e["ph"] == "M":
            assert e["name"] in METADATA
        if e["ph"] == "f":
            assert e["bp"] == "e"
    return events


def slices_by_track(events):
    out = {}
    for e in events:
        if e["ph"] == "X":
            out.setdefault((e["pid"], e["tid"]), []).append(e)
    return out


def check_flows_bind(events) -> None:
    """Each flow id starts once inside a slice and finishes once inside another."""
    tracks = slices_by_track(events)

    def enclosing(e):
        return [x for x in tracks[e["pid"], e["tid"]]
                if x["ts"] <= e["ts"] <= x["ts"] + x["dur"]]

    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == sum(1 for e in events if e["ph"] == "s")
    assert starts.keys() == ends.keys()
    for fid, s in starts.items():
        src, dst = enclosing(s), enclosing(ends[fid])
        assert src and dst, fid
        assert ends[fid]["ts"] >= s["ts"]  # the arrow goes forward in time


def test_gpipe_p2_m2_by_hand():
    """gpipe, 2 ranks, 2 microbatches, F=1, B=2 (1 unit = 1 ms = 1000 µs).

    8 slices; flows: 0F0→1F0, 0F1→1F1 (activations) and 1B0→0B0, 1B1→0B1 (gradients);
    counters per rank: 0 at the start, +1 at each F start, -1 at each B end = 5 each."""
    timeline = simulate(get_schedule("gpipe", 2, 2))
    events = check_format(trace_document([timeline]))
    phases = Counter(e["ph"] for e in events)
    assert phases == {"X": 8, "s": 4, "f": 4, "C": 10, "M": 8}
    x = [e for e in events if e["ph"] == "X"]
    assert [(e["pid"], e["name"], e["ts"], e["dur"]) for e in x if e["pid"] == 1] == [
        (1, "F0", 1000.0, 1000.0), (1, "F1", 2000.0, 1000.0),
        (1, "B0", 3000.0, 2000.0), (1, "B1", 5000.0, 2000.0),
    ]
    flows = {(e["name"], e["pid"], e["ts"]) for e in events if e["ph"] == "f"}
    assert flows == {("activation", 1, 1000.0), ("activation", 1, 2000.0),
                     ("gradient", 0, 5000.0), ("gradient", 0, 7000.0)}
    mem = [e["args"]["memory"] for e in events if e["ph"] == "C" and e["pid"] == 0]
    assert mem == [0, 1, 2, 1, 0]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"gpipe rank 0", "gpipe rank 1"}
    check_flows_bind(events)


def expected_counts(timeline) -> dict:
    S, M = timeline.num_stages, timeline.num_microbatches
    nonzero = sum(1 for a in timeline.mem_start if a) + sum(1 for b in timeline.mem_end if b)
    return {"X": len(timeline), "s": 2 * (S - 1) * M, "f": 2 * (S - 1) * M,
            "C": timeline.num_ranks + nonzero}


@pytest.mark.parametrize("name", ["1f1b", "split-iw", "interleaved-v2", "v-placement-iw",
                                  "overlap-v"])
def test_counts_match_the_timeline(name):
    schedule = get_schedule(name, 4, 8) if name == "1f1b" else hand_built()[name]
    timeline = simulate(schedule, CostModel(f=1, b=2, w=1, overlap=0.8))
    events = check_format(trace_document([timeline]))
    phases = Counter(e["ph"] for e in events)
    assert {k: phases[k] for k in "XsfC"} == expected_counts(timeline)
    check_flows_bind(events)
    # One track per chunk: tid = chunk + 1, and every slice's args name its action.
    tids = {e["tid"] for e in events if e["ph"] == "X"}
    assert tids == set(range(1, timeline.chunks + 1))
    for e in events:
        if e["ph"] == "X":
            a = e["args"]
            assert e["name"] == e["cat"] + str(a["microbatch"])
            assert a["action"] == f"{a['stage']}{e['cat']}{a['microbatch']}"
    overlapped = sum(1 for e in events if e["ph"] == "X" and e["args"]["overlapped"])
    assert overlapped == sum(timeline.overlapped)
    # W sends nothing: no flow starts in a W slice.
    if "W" in timeline.kind:
        w_tracks = [e for e in events if e["ph"] == "X" and e["cat"] == "W"]
        for s in (e for e in events if e["ph"] == "s"):
            assert not any(w["pid"] == s["pid"] and w["tid"] == s["tid"]
                           and w["ts"] <= s["ts"] < w["ts"] + w["dur"] for w in w_tracks)


def test_measured_trace_has_real_durations(tmp_path):
    """Measured timelines are in seconds: each slice lasts (end - start) x 1e6 µs."""
    torch.manual_seed(0)
    stages = [PipelineStage(torch.nn.Linear(8, 8)) for _ in range(2)]
    measured = Pipeline(stages, 2, "gpipe").step(torch.randn(4, 8), torch.randn(4, 8)).timeline
    predicted = simulate(get_schedule("gpipe", 2, 2), CostModel(f=1e-4, b=2e-4, w=0))
    path = write_trace(tmp_path / "t.json", [predicted, measured])
    doc = json.loads(path.read_text())
    events = check_format(doc)
    assert "1 s = 1e6 us" in doc["otherData"]["time_scale"]
    x = [e for e in events if e["ph"] == "X" and e["pid"] >= 2]  # the measured block
    t0 = min(measured.start)
    got = sorted((e["ts"], e["dur"]) for e in x)
    want = sorted(((e.start - t0) * 1e6, (e.end - e.start) * 1e6) for e in measured.events())
    assert [x for pair in got for x in pair] == pytest.approx(
        [x for pair in want for x in pair], abs=0.002)
    # Back-to-back actions stay back to back (no 1 ns overlaps from rounding).
    for track in slices_by_track(events).values():
        track.sort(key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-6
                   for a, b in zip(track, track[1:], strict=False))
    # Two timelines: pids 0-1 predicted, 2-3 measured; flow ids never collide.
    assert {e["pid"] for e in events} == {0, 1, 2, 3}
    ids = [e["id"] for e in events if e["ph"] == "s"]
    assert len(ids) == len(set(ids)) == 2 * 2 * (1 * 2)
    counters = [e for e in events if e["ph"] == "C" and e["pid"] == 2]
    assert counters[0]["name"] == "activation memory (bytes)"
    assert max(c["args"]["memory"] for c in counters) == measured.rank_stats()[0].peak_memory
    check_flows_bind(events)


def test_write_trace_errors(tmp_path):
    with pytest.raises(ValueError, match="at least one timeline"):
        trace_document([])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_trace(tmp_path / "none" / "t.json", [simulate(get_schedule("gpipe", 2, 2))])


def test_dualpipe_flows_stay_within_each_chain():
    """DualPipe p=4, M=8: two chains of 4 stages, 4 microbatches each. Messages (ir.deps)
    run inside a chain only: 2 chains x 2 directions x 3 hops x 4 microbatches = 48 flows,
    none from stage 3 (copy A's loss stage) to stage 4 (copy B's input stage)."""
    timeline = simulate(get_schedule("dualpipe", 4, 8))
    events = check_format(trace_document([timeline]))
    starts = [e for e in events if e["ph"] == "s"]
    assert len(starts) == 48 == sum(1 for e in events if e["ph"] == "f")
    check_flows_bind(events)
    slices = [e for e in events if e["ph"] == "X"]
    by_id = {e["id"]: e for e in events if e["ph"] == "f"}
    for s in starts:
        src = next(x for x in slices if x["pid"] == s["pid"] and x["tid"] == s["tid"]
                   and x["ts"] <= s["ts"] < x["ts"] + x["dur"])
        f = by_id[s["id"]]
        dst = next(x for x in slices if x["pid"] == f["pid"] and x["tid"] == f["tid"]
                   and x["ts"] == f["ts"])
        a, b = src["args"]["stage"], dst["args"]["stage"]
        assert abs(a - b) == 1 and (a < 4) == (b < 4)  # neighbours in the same chain
