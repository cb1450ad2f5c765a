"""The explorer under hostile clients: bad requests, bad files, idle and slow connections.

- every bad parameter value is 400 with the very line the CLI prints for the same flag (one
  table, ``pipebubble.params``, reads both);
- an uploaded file that the CLI would refuse is 400, never 500;
- no answer holds ``NaN`` or ``Infinity`` (hypothesis over the query);
- a pile of idle connections does not keep a real request from being answered, and a
  client that trickles its request gets 408 after the request timeout, while others are
  served meanwhile.

Servers here listen on 127.0.0.1 with small limits (a few connections, a 1 s timeout) so
the checks stay fast; no assertion is on speed, only on what is answered.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipebubble.cli import main
from pipebubble.params import PARAMS
from pipebubble.web.server import make_server, url_of

SIM = ["simulate", "--schedule", "gpipe", "-p", "4", "-m", "8"]


def _serve(**kwargs):
    server = make_server("127.0.0.1", 0, **kwargs)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server


@pytest.fixture(scope="module")
def url():
    server = _serve()
    yield url_of(server)
    server.shutdown()
    server.server_close()


def call(url: str, path: str, data: bytes | None = None, timeout: float = 30):
    req = urllib.request.Request(url.rstrip("/") + path, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def strict_json(body: bytes) -> object:
    """Parse as a browser does: ``NaN``/``Infinity`` are not JSON."""
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in a JSON answer")

    return json.loads(body, parse_constant=refuse)


def cli_line(capsys, argv: list[str]) -> str:
    """The CLI's error for ``argv``, without argparse's ``argument --x:`` prefix."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipebubble: error: "), err
    line = err[0][len("pipebubble: error: "):]
    if line.startswith("argument "):
        line = line.split(": ", 1)[1]
    return line


# ---- bad values: the CLI's words ----------------------------------------------------------------
HOSTILE = ["", " ", "-1", "0", "abc", "nan", "inf", "-inf", "1e308", "5e-324", "9" * 400,
           "1,,2", "1e3", "½", "0x10"]


@pytest.mark.parametrize("key", list(PARAMS))
def test_every_parameter_is_refused_with_the_cli_message(url, capsys, key):
    """For each parameter of the shared table and each hostile value: the CLI refuses it
    (exit 2) exactly when the API answers 400, and with the same line."""
    flag = PARAMS[key].flag
    for value in HOSTILE:
        status, body = call(url, f"/api/simulate?{key}={urllib.parse.quote(value)}")
        out = strict_json(body)
        rc = main([*SIM, f"{flag}={value}"])  # = : "-inf" is not an option
        captured = capsys.readouterr()
        if status == 200:
            assert rc in (0, 1), (key, value, captured.err)  # 1: over --memory-limit
            continue
        assert status == 400, (key, value, out)
        assert rc == 2, (key, value)
        line = captured.err.strip()[len("pipebubble: error: "):]
        if line.startswith("argument "):
            line = line.split(": ", 1)[1]
        assert out == {"error": line}, (key, value)


@pytest.mark.parametrize("query, argv", [
    ("ranks=", [*SIM, "-p", ""]),
    ("microbatches=", [*SIM, "-m", ""]),
    ("chunks=", [*SIM, "-v", ""]),
    ("f=1e308", [*SIM, "--f", "1e308"]),
    ("b=1e308", [*SIM, "--b", "1e308"]),
    ("mem_b=1e308", [*SIM, "--mem-b", "1e308"]),
    ("f=5e-324", [*SIM, "--f", "5e-324"]),
    ("memory_limit=nan", [*SIM, "--memory-limit", "nan"]),
    ("schedule=", ["simulate", "--schedule", "", "-p", "4", "-m", "8"]),
    ("schedule=auto&chunks=3", ["simulate", "--schedule", "auto", "-p", "4", "-m", "8", "-v",
                                "3"]),
    ("ranks=" + "9" * 5000, [*SIM, "-p", "9" * 5000]),
])
def test_bad_requests_are_400_with_the_cli_line(url, capsys, query, argv):
    for path in ("/api/simulate", "/api/sweep", "/api/csv", "/api/trace"):
        status, body = call(url, f"{path}?{query}")
        assert status == 400, (path, body)
        assert strict_json(body) == {"error": cli_line(capsys, argv)}, path


@pytest.mark.parametrize("ms, words", [
    ("", "ms must be an integer >= 1, got ''"),
    (",", "ms must be an integer >= 1, got ''"),
    ("0", "ms must be >= 1, got 0"),
    ("1e3", "ms must be an integer >= 1, got '1e3'"),
])
def test_bad_sweep_counts_are_400(url, ms, words):
    status, body = call(url, f"/api/sweep?ms={ms}")
    assert status == 400 and strict_json(body) == {"error": words}


def test_over_the_cli_limits_is_413(url):
    status, body = call(url, "/api/simulate?ranks=100001&microbatches=1")
    assert status == 413 and strict_json(body) == {
        "error": "100,001 ranks is over the limit of 100,000"}


def test_a_long_sweep_list_is_413(url):
    status, body = call(url, "/api/sweep?ms=" + ",".join(map(str, range(1, 100))))
    assert status == 413 and "at most 64" in strict_json(body)["error"]


# ---- bad files -------------------------------------------------------------------------------
EVENT = '{"rank": 0, "stage": 0, "kind": "F", "microbatch": 0, "start": %s, "end": %s}'
TIMELINE = '{"ranks": 1, "stages": 1, %s"events": [%s]}'


@pytest.mark.parametrize("body, words", [
    ("[" * 100_000 + "]" * 100_000, "nests 100000 levels deep"),
    ('{"a": ' * 5000 + "1" + "}" * 5000, "nests 5000 levels deep"),
    (TIMELINE % ("", EVENT % ("NaN", "1")), "NaN is not a number"),
    (TIMELINE % ("", EVENT % ("0", "Infinity")), "Infinity is not a number"),
    (TIMELINE % ('"closed_form_bubble": -Infinity, ', EVENT % ("0", "1")),
     "-Infinity is not a number"),
    (TIMELINE % ("", EVENT % ("0", "1e999")), "too large for a float"),
    (TIMELINE % ("", EVENT % ("0", "1" * 5000)), "an integer with 5000 digits"),
    (TIMELINE % ("", EVENT % ("0", "1e308")), "times must be at most 1e+12 in size"),
    ("0UNSHARD,0RESHARD\n", "no compute actions"),
    (",,,\n,,\n", "no actions"),
    ("\x00\x01\x02garbage\xff", "not UTF-8"),
])
def test_hostile_uploads_are_400(url, body, words):
    data = body.encode("latin-1") if "\xff" in body else body.encode()
    for path in ("/api/simulate", "/api/trace"):
        status, answer = call(url, path + "?name=up.json", data)
        out = strict_json(answer)
        assert status == 400, (path, out)
        assert words in out["error"] and "\n" not in out["error"], out


def test_marker_only_csv_is_the_cli_message(url, capsys, tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("0UNSHARD,0RESHARD\n1UNSHARD\n")
    expect = cli_line(capsys, ["simulate", "--csv", str(path)])
    status, answer = call(url, f"/api/simulate?name={path}", path.read_bytes())
    assert status == 400 and strict_json(answer) == {"error": expect}


# ---- nothing non-finite in any answer --------------------------------------------------------
VALUES = st.one_of(
    st.sampled_from(["", "0", "1", "2", "-1", "nan", "inf", "1e308", "1e12", "1e-12", "5e-324",
                     "0.5", "3", "1,2", "1,2,3,4", "1e12,1e12,1e12,1e12", "x"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-5, 40).map(str),
)
KEYS = st.sampled_from([*PARAMS, "schedule", "ms"])
SCHEDULES = st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "zbv",
                             "dualpipev", "auto", "nope"])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(KEYS, VALUES, max_size=5), SCHEDULES,
       st.sampled_from(["/api/simulate", "/api/sweep", "/api/csv", "/api/trace"]))
def test_no_answer_is_a_500_or_holds_infinity(url, query, schedule, path):
    query = {"schedule": schedule, "ranks": "2", "microbatches": "4", **query}
    if schedule == "auto":
        query["microbatches"] = "2"  # a small search
    status, body = call(url, path + "?" + urllib.parse.urlencode(query))
    assert status in (200, 400, 413), (query, body[:300])
    if path != "/api/csv":
        out = strict_json(body)
        if status != 200:
            assert set(out) == {"error"} and "\n" not in out["error"]


# ---- connections -----------------------------------------------------------------------------
def _raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and whatever came back until the server closed or 10 s passed."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                if length and len(rest) >= length[0]:
                    break
    except TimeoutError:
        pass
    return (int(data.split()[1]) if data.startswith(b"HTTP/") else 0), data


def test_idle_connections_do_not_block_a_real_request():
    """Five times the cap of idle connections, then a normal request: answered (200)."""
    server = _serve(max_connections=4, request_timeout=5, idle_timeout=60)
    port = server.server_address[1]
    idle = [_raw(port) for _ in range(20)]
    try:
        status, body = call(url_of(server), "/api/simulate?ranks=2&microbatches=2", timeout=10)
        assert status == 200 and strict_json(body)["step_time"] == 9.0  # (2 + 1) x 3
        assert server.open_connections() <= 4
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()
        server.server_close()


def test_busy_connections_beyond_the_cap_get_503_then_408():
    """Connections mid-request are not closed to make room: a new one gets 503 at once;
    each of them gets 408 when its request timeout passes."""
    server = _serve(max_connections=2, request_timeout=1.0, idle_timeout=60)
    port = server.server_address[1]
    busy = [_raw(port) for _ in range(2)]
    try:
        for sock in busy:
            sock.sendall(b"GET /api/meta HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line
        deadline = time.monotonic() + 10
        while server.busy_connections() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # until both are mid-request
        assert server.busy_connections() == 2
        extra = _raw(port)
        extra.sendall(b"GET /api/meta HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, data = _answer(extra)
        assert status == 503 and b"--max-connections" in data
        for sock in busy:
            status, data = _answer(sock)
            assert status == 408 and b"within 1 s" in data
        assert call(url_of(server), "/api/meta", timeout=10)[0] == 200  # room again
    finally:
        for sock in busy:
            sock.close()
        server.shutdown()
        server.server_close()


def test_a_slow_body_gets_408_and_others_are_served_meanwhile():
    server = _serve(max_connections=8, request_timeout=1.0)
    port = server.server_address[1]
    slow = _raw(port)
    try:
        slow.sendall(b"POST /api/simulate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Length: 1000\r\n\r\n0F0,")
        started = time.monotonic()
        served = False
        for _ in range(4):  # a byte every 0.4 s: each read is quick, the request is not
            time.sleep(0.4)
            try:
                slow.sendall(b"0")
            except OSError:
                break
            if not served:
                served = call(url_of(server), "/api/meta", timeout=10)[0] == 200
        status, data = _answer(slow)
        assert status == 408, data
        assert time.monotonic() - started < 10  # bounded: not the old 60 s (nor forever)
        assert served
    finally:
        slow.close()
        server.shutdown()
        server.server_close()


def test_the_command_takes_and_checks_the_limits(capsys):
    assert "--max-connections must be >= 1, got 0" in cli_line(
        capsys, ["explore", "--max-connections", "0", "--no-browser"])
    assert "--request-timeout must be a number in (0, 3600]" in cli_line(
        capsys, ["explore", "--request-timeout", "nan", "--no-browser"])


def test_the_server_binds_loopback_by_default():
    server = make_server(port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.server_close()
