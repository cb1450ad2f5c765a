"""The explorer's HTTP server: the standard library's ThreadingHTTPServer over ``api.py``.

Why the standard library: the explorer is a loopback tool for one person, serving one page
and a few small JSON answers; ``http.server`` needs no dependency and starts in
milliseconds. It binds to 127.0.0.1 by default and accepts only requests whose ``Host``
header names this machine (so a web page elsewhere cannot reach it through DNS rebinding)
unless it was asked to listen on another address.

Routes: ``/`` (the page), ``/static/<file>`` (its script and style, shipped in the package),
``/api/...`` (see :mod:`pipebubble.web.api`). Every request is answered, whatever happens:
bad input (a :class:`~pipebubble.errors.UserError`) → 400 ``{"error": "..."}``, over a
limit → 413, unknown path → 404, a bug → 500 with its message (and the traceback on
stderr); the server keeps serving. JSON answers never hold ``NaN`` or ``Infinity`` (browsers'
``JSON.parse`` refuses them): a non-finite number is a bug, answered 500.

Hostile or broken clients cannot starve the others:

- at most ``max_connections`` connections are served at once (one thread each). When a new
  one arrives at the cap, the oldest connection that is *idle* (waiting for its next
  request, no byte of it received) is closed to make room; when none is idle (all are
  mid-request), the new one gets 503 at once. So idle keep-alive connections never block a
  real request, and a flood of them costs one thread each up to the cap;
- a request must arrive whole (request line, headers, body) within ``request_timeout``
  seconds of its first byte, however the client trickles it: past that it gets 408 and the
  connection is closed; a connection idle for ``idle_timeout`` seconds is closed;
- a client that does not read its answer is dropped after ``request_timeout`` seconds.

>>> server = make_server("127.0.0.1", 0)
>>> server.server_address[0]
'127.0.0.1'
>>> server.server_close()
"""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qsl, urlsplit

from ..errors import UserError
from . import api

STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "charts.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
MAX_CONNECTIONS = 32  # connections served at once (a browser opens about six)
REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last
IDLE_TIMEOUT = 30.0  # seconds a connection may wait for its next request


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class _DeadlineReader(io.RawIOBase):
    """The socket as a raw stream whose every read waits at most until the handler's
    ``deadline`` (the socket's own timeout bounds one read, so a client sending a byte every
    few seconds would otherwise hold a request open forever). The first byte of a request
    turns the handler from idle to busy and starts the request's deadline."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001  (a writable buffer)
        handler = self.handler
        left = handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        handler.connection.settimeout(left)
        n = handler.connection.recv_into(buffer)
        if n and handler.idle:
            handler.began()
        return n


class Handler(BaseHTTPRequestHandler):
    server_version = "pipebubble-explore"
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT  # replaced per read by the deadline (see _DeadlineReader)
    idle = True  # waiting for a request; no byte of it received yet
    deadline = 0.0

    # ---- plumbing ---------------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_DeadlineReader(self))
        self.server.track(self)  # type: ignore[attr-defined]

    def began(self) -> None:
        """The first byte of a request arrived: it has ``request_timeout`` seconds to end."""
        self.idle = False
        self.deadline = time.monotonic() + self.server.request_timeout  # type: ignore[attr-defined]

    def handle_one_request(self) -> None:
        """One request, as the standard library reads it, within the deadlines: a client
        that stops mid-request gets 408 (an idle one is just closed)."""
        self.idle = True
        self.deadline = time.monotonic() + self.server.idle_timeout  # type: ignore[attr-defined]
        self.command, self.request_version = "", "HTTP/1.1"
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline = self.command = ""
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return  # it sent its own error
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(HTTPStatus.NOT_IMPLEMENTED,
                                f"Unsupported method ({self.command!r})")
                return
            method()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True
            if not self.idle:
                self._timed_out()
        except OSError:  # the client went away (or the server closed an idle connection)
            self.close_connection = True

    def _timed_out(self) -> None:
        timeout = self.server.request_timeout  # type: ignore[attr-defined]
        try:
            self._error(408, f"the request did not arrive whole within {timeout:g} s; the "
                        "explorer drops slow requests so that they cannot hold it up")
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  quiet by default
        if getattr(self.server, "verbose", False):
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, content_type: str,
              extra: dict[str, str] | None = None) -> None:
        # a client that does not read its answer is dropped after request_timeout seconds
        self.connection.settimeout(self.server.request_timeout)  # type: ignore[attr-defined]
        self.send_response(status)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: object, extra: dict[str, str] | None = None) -> None:
        text = json.dumps(obj, allow_nan=False)  # a non-finite number: a bug, answered 500
        self._send(status, text.encode(), "application/json", extra)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _host_ok(self) -> bool:
        if getattr(self.server, "any_host", False):
            return True
        host = (self.headers.get("Host") or "").strip()
        if not host:  # HTTP/1.0 without Host: no browser sends that, so no rebinding either
            return True
        name = host[:host.find("]") + 1] if host.startswith("[") else host.rsplit(":", 1)[0]
        return name in LOOPBACK

    def _body(self) -> bytes | None:
        """The request body, or None after answering 413 (too big) or 411."""
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            self._error(411, "POST needs a Content-Length header")
            return None
        try:
            n = int(length)
        except ValueError:
            n = -1
        if n < 0:
            self.close_connection = True
            self._error(400, f"bad Content-Length {length!r}")
            return None
        if n > api.MAX_BODY_BYTES:
            self.close_connection = True  # do not read it; the connection is dropped after
            self._error(413, f"the request body is {n} bytes; the explorer takes at most "
                        f"{api.MAX_BODY_BYTES} bytes")
            return None
        try:
            return self.rfile.read(n)
        except TimeoutError:
            self.close_connection = True
            self._timed_out()
            return None

    # ---- requests ---------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
        self._guarded(self._get)

    def do_HEAD(self) -> None:  # noqa: N802
        self._guarded(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._guarded(self._post)

    def _guarded(self, work) -> None:
        """Run one request; whatever it raises becomes an HTTP answer, never a dead server."""
        try:
            if not self._host_ok():
                self._error(403, f"Host {self.headers.get('Host')!r} is not this machine; "
                            "the explorer answers only on its loopback address")
                return
            work()
        except api.TooLarge as exc:
            self._error(413, str(exc))
        except UserError as exc:  # the user's input (ScheduleError too); any other error is a bug
            self._error(400, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # a bug: say so, log it, keep serving
            traceback.print_exc(file=sys.stderr)
            try:
                self._error(500, f"internal error ({type(exc).__name__}: {exc}); this is a "
                            "bug in pipebubble, please report it")
            except OSError:
                self.close_connection = True

    def _get(self) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        path = url.path
        if path in ("/", "/index.html"):
            self._send(200, _static("index.html"), STATIC["index.html"])
        elif path.startswith("/static/") and path[len("/static/"):] in STATIC:
            name = path[len("/static/"):]
            self._send(200, _static(name), STATIC[name])
        elif path == "/api/meta":
            self._json(200, api.meta())
        elif path == "/api/simulate":
            self._json(200, api.simulate_get(params))
        elif path == "/api/sweep":
            self._json(200, api.sweep(params))
        elif path == "/api/csv":
            name = str(params.get("schedule") or "schedule")
            self._send(200, api.schedule_csv(params).encode(), "text/csv; charset=utf-8",
                       {"Content-Disposition": f'attachment; filename="{_safe(name)}.csv"'})
        elif path == "/api/trace":
            self._trace(params, None)
        elif path == "/favicon.ico":
            self._send(204, b"", "image/x-icon")
        else:
            self._error(404, f"no such page {path!r}; the explorer serves / and /api/...")

    def _post(self) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        if url.path not in ("/api/simulate", "/api/trace"):
            self._error(404, f"no such endpoint {url.path!r} for POST; valid are "
                        "/api/simulate and /api/trace")
            return
        body = self._body()
        if body is None:
            return
        if url.path == "/api/simulate":
            self._json(200, api.simulate_post(body, params))
        else:
            self._trace(params, body)

    def _trace(self, params: dict, body: bytes | None) -> None:
        doc = api.trace(params, body)
        name = _safe(str(params.get("name") or params.get("schedule") or "timeline"))
        self._json(200, doc, {"Content-Disposition": f'attachment; filename="{name}.trace.json"'})


def _safe(name: str) -> str:
    """A file name for Content-Disposition: letters, digits, ``-_.`` only."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "file"


class ExplorerServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them (see the module doc:
    the oldest idle connection makes room for a new one; with none idle, 503)."""

    daemon_threads = True
    block_on_close = False  # server_close() does not wait for idle keep-alive connections

    def __init__(self, address: tuple, max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT,
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.verbose = False
        self.any_host = False
        self._lock = threading.Lock()
        self._open: dict[socket.socket, Handler | None] = {}  # oldest first
        self._closing: set[socket.socket] = set()
        super().__init__(address, Handler)

    def track(self, handler: Handler) -> None:
        with self._lock:
            if handler.request in self._open:
                self._open[handler.request] = handler

    def process_request(self, request, client_address) -> None:  # noqa: ANN001
        """Admit a new connection (in the accepting thread: never blocks)."""
        with self._lock:
            if len(self._open) - len(self._closing) >= self.max_connections:
                victim = next((sock for sock, h in self._open.items() if sock not in
                               self._closing and (h is None or h.idle)), None)
                if victim is None:
                    busy = len(self._open)
                else:
                    self._closing.add(victim)
                    busy = 0
            else:
                victim, busy = None, 0
            if not busy:
                self._open[request] = None
        if busy:
            self._refuse(request, busy)
            return
        if victim is not None:
            try:  # its thread's blocked read returns at once; the thread ends
                victim.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open.pop(request, None)
                self._closing.discard(request)

    def _refuse(self, request: socket.socket, busy: int) -> None:
        body = json.dumps({"error": f"the explorer is answering {busy} requests, its limit "
                           "(explore --max-connections); try again in a moment"}).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n"
                "Cache-Control: no-store\r\n\r\n").encode()
        try:
            request.settimeout(0.5)
            request.sendall(head + body)
        except OSError:
            pass
        self.shutdown_request(request)

    def open_connections(self) -> int:
        """Connections being served now (closing ones not counted)."""
        with self._lock:
            return len(self._open) - len(self._closing)


class ExplorerServer6(ExplorerServer):
    address_family = socket.AF_INET6


def make_server(host: str = "127.0.0.1", port: int = 8765, *, verbose: bool = False,
                max_connections: int = MAX_CONNECTIONS,
                request_timeout: float = REQUEST_TIMEOUT,
                idle_timeout: float = IDLE_TIMEOUT) -> ExplorerServer:
    """A ready (not yet serving) explorer server; ``port=0`` picks a free port.

    Call ``serve_forever()`` on it (or in a thread) and ``shutdown()`` to stop. Raises
    ``UserError`` with one line when the address cannot be used. ``max_connections``,
    ``request_timeout`` and ``idle_timeout``: see the module doc.
    """
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in 0..65535 (0: any free port), got {port}")
    cls = ExplorerServer6 if ":" in host else ExplorerServer  # an IPv6 address
    try:
        server = cls((host, port), max_connections, request_timeout, idle_timeout)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another "
                         "--port (0: any free port) or --host") from None
    server.verbose = verbose
    server.any_host = host not in LOOPBACK
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    """``http://127.0.0.1:PORT/`` for a server from :func:`make_server`."""
    host, port = server.server_address[:2]
    host = f"[{host}]" if ":" in str(host) else host
    return f"http://{host}:{port}/"
