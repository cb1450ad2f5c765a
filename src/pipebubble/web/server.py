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

Hostile or broken clients cannot starve the others (:mod:`pipebubble.web.connections`): at
most ``max_connections`` connections at once, the oldest idle one closed to make room for a
new one (503 when none is idle); a request must arrive whole within ``request_timeout``
seconds of its first byte (else 408); a client that does not read its answer is dropped
after ``request_timeout`` seconds.

>>> server = make_server("127.0.0.1", 0)
>>> server.server_address[0]
'127.0.0.1'
>>> server.server_close()
"""

from __future__ import annotations

import json
import socket
import sys
import traceback
from http.server import ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qsl, urlsplit

from ..errors import ParamError, UserError, param
from . import api
from .connections import (  # noqa: F401  (MAX_CONNECTIONS, REQUEST_TIMEOUT: explore's flags)
    IDLE_TIMEOUT,
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT,
    BoundedServer,
    DeadlineHandler,
)

STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "charts.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class Handler(DeadlineHandler):
    server_version = "pipebubble-explore"
    protocol_version = "HTTP/1.1"

    # ---- plumbing ---------------------------------------------------------------------
    def timed_out(self) -> None:
        timeout = self.server.request_timeout  # type: ignore[attr-defined]
        self._error(408, f"the request did not arrive whole within {timeout:g} s; the "
                    "explorer drops slow requests so that they cannot hold it up")

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
            self.timed_out()
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
            self._error(413, api.error_text(exc))
        except UserError as exc:  # the user's input (ScheduleError too); any other error is a bug
            text = api.error_text(exc)
            self._error(400, text.splitlines()[0] if text else type(exc).__name__)
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
            self._send(200, api.index_page(_static("index.html")), STATIC["index.html"])
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


class ExplorerServer(BoundedServer):
    """The explorer: :class:`~pipebubble.web.connections.BoundedServer` over :class:`Handler`."""

    def __init__(self, address: tuple, max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT,
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.verbose = False
        self.any_host = False
        super().__init__(address, Handler, max_connections, request_timeout, idle_timeout)


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
        raise ParamError(f"{param('port')} must be in 0..65535 (0: any free port), got {port}")
    cls = ExplorerServer6 if ":" in host else ExplorerServer  # an IPv6 address
    try:
        server = cls((host, port), max_connections, request_timeout, idle_timeout)
    except OSError as exc:
        raise ParamError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another "
                         f"{param('port')} (0: any free port) or {param('host')}") from None
    server.verbose = verbose
    server.any_host = host not in LOOPBACK
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    """``http://127.0.0.1:PORT/`` for a server from :func:`make_server`."""
    host, port = server.server_address[:2]
    host = f"[{host}]" if ":" in str(host) else host
    return f"http://{host}:{port}/"
