"""Executors: run a Schedule on real tensors, in one process or one process per rank.

- ``interpreter.py``: the stage interpreter, one handler per action kind (F, B, I, W, and
  Overlap steps), recomputation; it does not know which schedule it runs.
- ``split.py``: the split backward (I now, W later) on any autograd graph.
- ``memory.py``: the activation bytes a stage holds for its backward, CUDA allocator peaks.
- ``clock.py``: per-rank virtual clock (measured or cost-model durations), wall clock.
- ``transport.py``: how activations and gradients reach the next stage (in process here).
- ``local.py``: every rank in one process, taking turns (``run_local``).
- ``pipeline.py``: the lesson's ``Pipeline`` and ``PipelineStage``.
- ``stages.py``: cut a layer list into stages (the one stage-cutting function);
  ``cut.py``: where a run cuts (its one rule: balanced by the layers' FLOPs).
- ``setup.py``, ``run.py``: a run's owner: ``RunConfig`` (what to run, plain values) and
  ``Run`` (set-up, batches, step, train, the check's verdict); ``trainplan.py`` its
  training plan (steps, optimizer, checkpoint), ``failures.py`` the model's failures named.

One process per rank (torch.distributed; ``pipebubble run`` without ``--local``) lives in
``dist/``; the sleep workload in ``pipebubble.models.sleep``; calibrating a CostModel from a
measured run in ``pipebubble.plan.calibrate``. Nothing here knows the command line.
"""
