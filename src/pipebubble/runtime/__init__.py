"""Executors: run a Schedule on real tensors, in one process or one process per rank.

- ``interpreter.py``: the stage interpreter, one handler per action kind (F, B, I, W, and
  Overlap steps), recomputation; it does not know which schedule it runs.
- ``split.py``: the split backward (I now, W later) on any autograd graph.
- ``memory.py``: the activation bytes a stage holds for its backward, CUDA allocator peaks.
- ``clock.py``: per-rank virtual clock (measured or cost-model durations), wall clock.
- ``transport.py``: how activations and gradients reach the next stage (in process here).
- ``local.py``: every rank in one process, taking turns (``run_local``).
- ``pipeline.py``: the lesson's ``Pipeline`` and ``PipelineStage``.
- ``stages.py``: cut a layer list into stages (even split or given boundaries).
- ``calibrated.py``: CostModel from a measured run, and the simulator's prediction.

One process per rank (torch.distributed; ``pipebubble run`` without ``--local``):

- ``p2p.py``: the transport over point-to-point messages, driven by the wire program
  (``pipebubble.wire``: SEND/RECV per rank, orderings naive / parity / batched).
- ``distributed.py``: the per-rank driver (``Cluster``: store, process group, watchdog;
  ``Worker``: one pipeline's stages and steps; data-parallel all-reduce).
- ``watchdog.py``: heartbeats, deadlock detection, failure propagation through the store.
- ``launch.py``: start ``ranks x dp`` workers on this machine as torchrun would; no orphans.
- ``dist_cli.py``: the ``run`` command's distributed path (launcher or worker).
- ``report.py``: rank 0's clock alignment, measured timeline and message-delay estimate.
- ``dataparallel.py``: the 2D step time (all-reduce after each rank's last action).
- ``sleep.py``: the sleep workload (``--model sleep``).
- ``selfcheck.py``: every schedule x layout x ordering against the unsplit model, one launch.
"""
