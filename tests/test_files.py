"""Safe file I/O (files.py), work limits (limits.py), checked timeline JSON (timeline_io.py),
and the distributed run's hardening: a loopback-only store and a watchdog that survives a
malformed heartbeat."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule, schedule_names, simulate
from pipebubble.commands.common import timeline_json
from pipebubble.files import (
    FileError,
    check_output_path,
    json_depth,
    open_output,
    parse_json,
    read_json_file,
    read_text_file,
    write_text,
)
from pipebubble.ir.schedule import ScheduleError
from pipebubble.limits import (
    LimitError,
    check_actions,
    check_sweep,
    estimate_actions,
    model_params,
)
from pipebubble.timeline_io import timeline_from_json


# ---- reading ---------------------------------------------------------------------------------
def test_read_text_file_refuses_what_is_not_a_regular_utf8_file(tmp_path):
    (tmp_path / "ok.txt").write_bytes(b"\xef\xbb\xbfhello")  # a BOM is dropped
    assert read_text_file(tmp_path / "ok.txt") == "hello"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "bad.txt").write_bytes(b"ab\xffcd")
    cases = [
        (tmp_path, "is a directory"),
        ("", "empty file name"),
        (tmp_path / "fifo", "not a regular file"),  # would block forever if opened plainly
        ("/dev/null", "not a regular file"),
        (tmp_path / "missing", "no such file"),
        (tmp_path / "ok.txt" / "x", "a directory in the path is a file"),
        (tmp_path / "bad.txt", "not UTF-8 text (byte 0xff at offset 2)"),
    ]
    for path, expect in cases:
        with pytest.raises(FileError, match=".*") as info:
            read_text_file(path, "--thing")
        assert expect in str(info.value) and "--thing" in str(info.value)
        assert "\n" not in str(info.value)


def test_size_limit_is_exact(tmp_path):
    f = tmp_path / "f"
    f.write_text("x" * 100)
    assert len(read_text_file(f, limit=100)) == 100
    with pytest.raises(FileError, match="100 bytes, over the limit of 99 bytes"):
        read_text_file(f, limit=99)


def test_json_checks(tmp_path):
    assert parse_json("[[[1]]]", max_depth=3) == [[[1]]]
    with pytest.raises(FileError, match="nests 4 levels deep; at most 3"):
        parse_json("[[[[1]]]]", max_depth=3)
    with pytest.raises(FileError, match="an integer with 31 digits; at most 30"):
        parse_json("[" + "1" * 31 + "]")
    assert parse_json("[" + "1" * 30 + "]") == [int("1" * 30)]
    for text in ("[1e999]", "[-1e400]"):
        with pytest.raises(FileError, match="too large for a float"):
            parse_json(text)
    for text in ("[NaN]", "[Infinity]", "[-Infinity]"):
        with pytest.raises(FileError, match="is not a number"):
            parse_json(text)
    with pytest.raises(FileError, match=r"is not valid JSON: Expecting value: line 1 column 2"):
        parse_json("[,]")
    (tmp_path / "a.json").write_text('{"a": "]]]]]]"}')  # brackets in strings do not nest
    assert read_json_file(tmp_path / "a.json", max_depth=1) == {"a": "]]]]]]"}


json_values = st.recursive(
    st.none() | st.integers() | st.text(alphabet='ab[]{}"\\'),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(alphabet="[]{}k\"", max_size=3), inner, max_size=3),
    max_leaves=20,
)


def _depth(x) -> int:
    if isinstance(x, list):
        return 1 + max((_depth(y) for y in x), default=0)
    if isinstance(x, dict):
        return 1 + max((_depth(y) for y in x.values()), default=0)
    return 0


@given(json_values)
def test_json_depth_matches_the_structure(value):
    """Brackets inside strings (escaped quotes included) never count."""
    assert json_depth(json.dumps(value)) == _depth(value)


# ---- writing ---------------------------------------------------------------------------------
def test_check_output_path_refusals(tmp_path):
    (tmp_path / "file").write_text("")
    cases = [
        (f"{tmp_path}/newdir/", "ends with '/'"),
        (str(tmp_path), "is a directory"),
        ("", "empty file name"),
        (f"{tmp_path}/missing/x.png", "does not exist"),
        (f"{tmp_path}/file/x.png", "is a file, not a directory"),
        (f"{tmp_path}/{'a' * 256}", "file name of 256 bytes is longer than the 255"),
    ]
    for path, expect in cases:
        with pytest.raises(FileError) as info:
            check_output_path(path, "--png")
        assert expect in str(info.value) and str(info.value).startswith("--png")
    assert not (tmp_path / "newdir").exists()
    assert check_output_path(f"{tmp_path}/{'a' * 255}") is not None
    assert check_output_path("/dev/null") is not None  # an existing device is fine


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_directory(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    with pytest.raises(FileError, match="permission denied"):
        check_output_path(d / "x.png", "--png")


def test_full_disk_is_one_line():
    with pytest.raises(FileError, match=r"cannot write --trace '/dev/full': no space left"):
        write_text("/dev/full", "x" * 10, "--trace")


def test_a_failed_write_leaves_no_half_file(tmp_path):
    target = tmp_path / "out.csv"
    with pytest.raises(RuntimeError):
        with open_output(target) as f:
            f.write("half")
            raise RuntimeError("the writer failed")
    assert not target.exists()
    write_text(target, "whole")
    assert target.read_text() == "whole"


# ---- limits ----------------------------------------------------------------------------------
@given(st.sampled_from(schedule_names(searched=False)), st.integers(1, 6), st.integers(1, 24),
       st.integers(1, 3))
def test_action_estimate_bounds_every_schedule(name, p, m, v):
    """3·p·v·m (F, I, W per stage and microbatch) is never below the real count."""
    try:
        schedule = get_schedule(name, p, m, v)
    except ScheduleError:
        try:
            schedule = get_schedule(name, p, m)
            v = None
        except ScheduleError:
            return
    assert schedule.num_actions() <= estimate_actions(p, m, v, name)


def test_check_actions_at_the_limit():
    assert check_actions(4, 8, 1, limit=96) == 96  # 3 x 4 x 1 x 8
    with pytest.raises(LimitError, match="makes about 96 actions, over the limit of 95; use "
                       "fewer or raise max_actions"):
        check_actions(4, 8, 1, limit=95)


def test_sweep_counts_work_not_points():
    # 1f1b: 3 x p x m actions per point; p=2, m=1..4: 6 x (1+2+3+4) = 60
    assert check_sweep(["1f1b"], 2, [1, 2, 3, 4], limit=60) == 60
    with pytest.raises(LimitError, match="about 60 actions in all, over the limit of 59"):
        check_sweep(["1f1b"], 2, [1, 2, 3, 4], limit=59)


@pytest.mark.parametrize("model,kwargs", [("mlp", {"layers": 3, "width": 16}),
                                          ("transformer", {"layers": 2, "dim": 32})])
def test_model_params_formula_matches_torch(model, kwargs):
    from pipebubble.models import build_model

    spec = build_model(model, **kwargs)
    real = sum(p.numel() for layer in spec.layers for p in layer.parameters())
    width = kwargs.get("width", kwargs.get("dim"))
    assert model_params(model, kwargs["layers"], width) == real


# ---- timeline JSON ---------------------------------------------------------------------------
def test_timeline_round_trip_through_json():
    t = simulate(get_schedule("zb-h1", 3, 6), CostModel(f=1, b=2, w=1))
    back = timeline_from_json(json.loads(json.dumps(timeline_json(t, None))))
    assert back.step_time == t.step_time
    assert back.bubble_fraction == pytest.approx(t.bubble_fraction)
    assert [s.busy for s in back.rank_stats()] == [s.busy for s in t.rank_stats()]
    assert back.stage_to_rank == t.stage_to_rank


def _tl(**event):
    e = {"rank": 0, "stage": 0, "kind": "F", "microbatch": 0, "start": 0, "end": 1, **event}
    e1 = {"rank": 1, "stage": 1, "kind": "F", "microbatch": 0, "start": 1, "end": 2}
    return {"ranks": 2, "stages": 2, "microbatches": 2, "events": [e, e1]}


@pytest.mark.parametrize("data,expect", [
    (_tl(rank=-1), "events[0].rank is -1; valid ranks are 0..1"),
    (_tl(rank=2), "events[0].rank is 2; valid ranks are 0..1"),
    (_tl(stage=-3), "events[0].stage is -3; valid stages are 0..1"),
    (_tl(microbatch=2), "events[0].microbatch is 2; valid microbatches are 0..1"),
    (_tl(rank=True), "events[0].rank must be a whole number, got True"),
    (_tl(kind="X"), "events[0].kind is 'X'; valid are F, I, W, B"),
    (_tl(start=float("nan")), "events[0].start must be a finite number"),
    (_tl(end="1"), "events[0].end must be a finite number"),
    (_tl(start=2, end=1), "events[0] ends at 1.0 before it starts at 2.0"),
    ({**_tl(), "ranks": 0}, "'ranks' must be between 1 and 100,000, got 0"),
    ({**_tl(), "stages": 1}, "'stages' is 1, fewer than 'ranks' 2"),
    ({**_tl(), "ranks": 10**9}, "'ranks' must be between 1 and 100,000"),
    ({**_tl(), "events": []}, "'events' is empty"),
    ({**_tl(), "events": {}}, "'events' must be a list"),
    ({"ranks": 2, "stages": 2}, "'events' must be a list of events, got NoneType (missing)"),
    ([1, 2], "expected a JSON object"),
    ({**_tl(), "stages": 4}, "'stages' is 4 but no event runs stage 2 (nor 1 other stages); "
     "every stage needs events"),
])
def test_timeline_json_errors_name_field_and_value(data, expect):
    with pytest.raises(FileError) as info:
        timeline_from_json(data, "t.json")
    assert str(info.value) == f"t.json: {expect}" or expect in str(info.value)


def test_a_stage_on_two_ranks_is_refused():
    data = _tl()
    data["events"].insert(1, {"rank": 1, "stage": 0, "kind": "B", "microbatch": 0, "start": 1,
                           "end": 2})
    with pytest.raises(FileError, match="puts stage 0 on rank 1, but an earlier event has it "
                       "on rank 0"):
        timeline_from_json(data)


# ---- distributed hardening -------------------------------------------------------------------
def test_is_loopback():
    from pipebubble.runtime.dist.launch import is_loopback

    assert [is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost",
                                     "10.0.0.1", "0.0.0.0", "node-3")] == \
        [True, True, True, True, False, False, False]


def _listening_addresses(port: int) -> list[str]:
    """Local addresses listening on ``port`` (from /proc/net/tcp and tcp6)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                out.append(addr)
    return out


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc/net/tcp")
def test_launcher_store_listens_on_loopback_only():
    import torch.distributed as dist

    from pipebubble.runtime.dist.launch import loopback_store

    store = loopback_store(2, timeout=10)
    assert _listening_addresses(store.port) == ["0100007F"]  # 127.0.0.1, nothing else
    client = dist.TCPStore("127.0.0.1", store.port, 2, False,
                           timeout=__import__("datetime").timedelta(seconds=10))
    client.set("k", "v")
    assert store.get("k") == b"v"


class FakeStore:
    """The few TCPStore calls the watchdog makes, over a dict."""

    def __init__(self, values: dict[str, bytes]):
        self.values = values

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.values[key]

    def check(self, keys):
        return all(k in self.values for k in keys)

    def multi_get(self, keys):
        return [self.values[k] for k in keys]

    def compare_set(self, key, expected, desired):
        self.values.setdefault(key, desired.encode())
        return self.values[key]


@pytest.mark.parametrize("bad", [b"garbage", b"\xff\xfe|1|wait|x", b"1|many|wait|x",
                                 b"1|2|sleeping|x", b"1|-5|wait|x", b""])
def test_watchdog_survives_a_malformed_heartbeat(bad):
    """A malformed peer heartbeat is skipped (no exception, no exit); once the peer's
    heartbeats are well-formed again, a real stall is still detected as a deadlock."""
    from pipebubble.runtime.dist.watchdog import EXIT_DEADLOCK, Watchdog

    store = FakeStore({"hb/1": bad})
    exits: list[int] = []
    wd = Watchdog(store, 0, 2, stall_timeout=0.0, heartbeat_timeout=60, exit_fn=exits.append)
    wd.at("recv 1F0", waiting=True)
    wd._beat()
    for _ in range(3):
        wd._check_peers()
    assert exits == []
    store.set("hb/1", "5|0|wait|recv 0B0")
    store.set("stuck/1", "recv 0B0")
    wd._check_peers()  # both waiting, counts unchanged from now on
    wd._check_peers()
    assert exits == [EXIT_DEADLOCK]


@pytest.mark.slow
def test_a_worker_found_through_the_environment_says_so(tmp_path):
    """RANK/WORLD_SIZE set (as torchrun sets them): the command acts as that worker and says
    so; with one rank it hosts the store itself (on loopback) and completes the step."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    env.pop("PIPEBUBBLE_LAUNCHER", None)
    res = subprocess.run([sys.executable, "-m", "pipebubble", "run", "--schedule", "1f1b",
                          "-p", "1", "-m", "1", "--json"], env=env, capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert ("RANK=0 and WORLD_SIZE=1 are set in the environment: acting as one worker"
            in res.stderr)
    assert json.loads(res.stdout)["ranks"] == 1


def test_a_malformed_failure_record_is_reported_not_mistaken_for_a_dead_store():
    from pipebubble.runtime.dist.watchdog import read_failure

    assert read_failure(FakeStore({"failed": b"rank 1 failed: \xff"})) == \
        "rank 1 failed: \ufffd"
    assert read_failure(FakeStore({})) is None


def test_a_timeline_with_no_ranks_names_the_count():
    """Once "valid ranks are 0..-4": the count itself is the bad value."""
    from pipebubble.timeline import Event, Timeline

    with pytest.raises(ValueError, match="a timeline needs num_ranks >= 1, got -3"):
        Timeline.from_events([Event(0, 0, "F", 0, 0.0, 1.0)], schedule="x", num_ranks=-3,
                             num_stages=1, num_microbatches=1, stage_to_rank=[0])
