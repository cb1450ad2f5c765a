"""The bubble explorer: ``pipebubble explore`` serves one page over the simulate JSON contract.

- ``api.py``: request parameters → the ``simulate --json`` object, sweeps, CSV, traces;
- ``server.py``: the standard library's threading HTTP server, loopback by default;
- ``connections.py``: a cap on connections (idle ones make room) and per-request deadlines;
- ``static/``: the page: ``index.html``, ``app.js`` (controls, requests), ``charts.js`` (SVG
  drawing, downloads), ``style.css``; shipped in the package: no CDN, no network.

The page draws what the server computes; there is no simulator in JavaScript.
"""
