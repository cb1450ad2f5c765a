"""One process per rank over torch.distributed (``pipebubble run`` without ``--local``).

- ``p2p.py``: the transport over point-to-point messages, driven by the wire program.
- ``worker.py``: the per-rank driver (``Cluster``: store, process group, watchdog; ``Worker``:
  one pipeline's stages and steps; data-parallel all-reduce).
- ``watchdog.py``: heartbeats, deadlock detection, failure propagation through the store.
- ``launch.py``: start ``ranks x dp`` workers on this machine as torchrun would; no orphans.
- ``report.py``: rank 0's clock alignment, measured timeline and message-delay estimate.
- ``selfcheck.py``: every schedule x layout x ordering against the unsplit model, one launch.

The ``run`` command's flags and its launcher-or-worker driver are in
``pipebubble.commands._run_dist``.
"""
