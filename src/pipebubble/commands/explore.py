"""``pipebubble explore``: the interactive bubble explorer in the browser.

Starts the explorer's web server (:mod:`pipebubble.web.server`) on 127.0.0.1, prints
``serving http://127.0.0.1:PORT/`` as its first line, opens the page in the browser unless
``--no-browser``, and serves until Ctrl-C. The page asks the server for the same JSON
``simulate --json`` prints.
"""

from __future__ import annotations

import argparse
import sys
import threading

from ..errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explore", help="explore every schedule's bubble in the browser",
                       description="Serve the interactive bubble explorer on this machine and "
                       "open it in the browser. Ctrl-C stops it.")
    p.add_argument("--port", type=int, default=8765,
                   help="port to listen on (8765; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1: this machine only; the page has no "
                   "authentication)")
    add_connection_flags(p)
    p.add_argument("--no-browser", action="store_true", help="do not open the browser")
    p.add_argument("--verbose", action="store_true", help="log every request on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..web.server import LOOPBACK, make_server, url_of

    if not args.host.strip():  # "" would bind every interface (0.0.0.0) without saying so
        raise UserError(f"--host {args.host!r} is empty (it would listen on every interface); "
                        "give 127.0.0.1 for this machine only, or an address of this machine")
    server = make_server(args.host, args.port, verbose=args.verbose)
    server.max_connections, server.request_timeout = args.max_connections, args.request_timeout
    url = url_of(server)
    print(f"serving {url}", flush=True)
    if args.host not in LOOPBACK:
        bound = server.server_address[0]  # what the socket is bound to, not what was typed
        sys.stderr.write(f"pipebubble: warning: listening on {bound}, not only this "
                         "machine: the explorer has no authentication, anyone who can reach "
                         "this address can use it\n")
    if not args.no_browser:
        import webbrowser

        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.server_close()
    return 0


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    """--max-connections and --request-timeout (see ``pipebubble.web.connections``)."""
    from ..web.connections import MAX_CONNECTIONS, REQUEST_TIMEOUT
    from .common import float_flag, int_flag

    p.add_argument("--max-connections", type=int_flag("--max-connections", 1, 1024),
                   default=MAX_CONNECTIONS, metavar="N",
                   help=f"connections served at once ({MAX_CONNECTIONS}); beyond it the oldest "
                   "idle one is closed, or the new one gets 503 when none is idle")
    p.add_argument("--request-timeout", default=REQUEST_TIMEOUT, metavar="S",
                   type=float_flag("--request-timeout", 0, 3600, lo_open=True),
                   help=f"seconds a request may take to arrive whole ({REQUEST_TIMEOUT:g}); a "
                   "slower client gets 408")
