"""Connections that cannot starve each other: a cap with idle eviction, and deadlines.

The standard library's ``ThreadingHTTPServer`` starts one thread per connection, without a
cap, and bounds only each single read by the socket timeout. So 400 idle connections hold
400 threads and a client that sends a byte every few seconds holds its request open
forever. Here (the explorer's server builds on both classes):

- :class:`BoundedServer` serves at most ``max_connections`` connections at once. When a new
  one arrives at the cap, the oldest *idle* one (waiting for its next request, no byte of it
  received) is closed to make room; when none is idle (every one is mid-request), the new
  one gets 503 at once, from the accepting thread, which never waits;
- :class:`DeadlineHandler` gives a request ``request_timeout`` seconds from its first byte to
  its last (request line, headers, body), however slowly it trickles in, and a connection
  ``idle_timeout`` seconds to start its next request; past either it is closed, a request
  that had begun with 408 first.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_CONNECTIONS = 32  # connections served at once (a browser opens about six)
REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last
IDLE_TIMEOUT = 30.0  # seconds a connection may wait for its next request


class DeadlineReader(io.RawIOBase):
    """The socket as a raw stream whose every read waits at most until the handler's
    ``deadline`` (the socket's own timeout bounds one read, so a client sending a byte every
    few seconds would otherwise hold a request open forever). The first byte of a request
    turns the handler from idle to busy and starts the request's deadline."""

    def __init__(self, handler: DeadlineHandler) -> None:
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


class DeadlineHandler(BaseHTTPRequestHandler):
    """A request handler whose reads keep the deadlines (see the module doc). Subclasses
    answer a timed-out request in :meth:`timed_out` (the default: a plain 408)."""

    timeout = REQUEST_TIMEOUT  # replaced per read by the deadline (see DeadlineReader)
    idle = True  # waiting for a request; no byte of it received yet
    deadline = 0.0

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(DeadlineReader(self))
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
                try:
                    self.timed_out()
                except OSError:
                    pass
        except OSError:  # the client went away (or the server closed an idle connection)
            self.close_connection = True

    def timed_out(self) -> None:
        """Answer a request that did not arrive whole in time (the connection closes)."""
        self.send_error(HTTPStatus.REQUEST_TIMEOUT)


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them (see the module doc:
    the oldest idle connection makes room for a new one; with none idle, 503)."""

    daemon_threads = True
    block_on_close = False  # server_close() does not wait for idle keep-alive connections

    def __init__(self, address: tuple, handler: type[DeadlineHandler],
                 max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT,
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._open: dict[socket.socket, DeadlineHandler | None] = {}  # oldest first
        self._closing: set[socket.socket] = set()
        super().__init__(address, handler)

    def track(self, handler: DeadlineHandler) -> None:
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
                           "(--max-connections); try again in a moment"}).encode()
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

    def busy_connections(self) -> int:
        """Connections in the middle of a request (its first byte read, its answer not sent)."""
        with self._lock:
            return sum(1 for h in self._open.values() if h is not None and not h.idle)
