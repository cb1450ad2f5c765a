"""Planning: measure or model the layers, cut them into stages, choose a configuration.

- ``profile.py``: per-layer time, parameters and activation bytes (measured).
- ``partition.py``: the exact min-max partitioner (contiguous layers into stages).
- ``balance.py``: cutting by time, parameters or simulation; rebalancing from a measured run.
- ``layouts.py``: Megatron and torchtitan settings for a cut.
- ``calibrate.py``: per-stage costs from a measured timeline.
- ``measured.py``: rebalancing from measured stage times on real tensors.
- ``sweep.py``: step time and bubble over microbatches for several schedules.
- ``analytic.py``: per-layer parameters, FLOPs, time and activation bytes of a transformer
  from its shape (Korthikanti et al. 2022), no tensors.
- ``moe.py``: the same for mixtures of experts (router, active and shared experts, total and
  active parameters, dispatched tokens, all-to-all bytes; MLA attention), from HF configs.
- ``layercosts.py``: per-layer costs at any microbatch size and recomputation mode.
- ``planner.py`` (with ``plans.py``, ``families.py``): choose pp, dp, microbatch size,
  schedule, chunks and recomputation under a memory budget, scored by the simulator;
  ``search.py``: the loop over every point of the axes around the pipeline; ``scoring.py``:
  the plan of one configuration, a ``Searcher`` composed of parts: ``schedule_facts.py``
  (schedules and what their orders say), ``configs.py`` (what to try), ``cuts.py`` (where to
  cut), ``cut_price.py`` (a cut's costs and lower bound), ``memory_bounds.py`` (fits, from
  the order alone), ``cut_score.py`` (a cut simulated into a plan), ``auto_plans.py``
  (``auto``) and ``least_memory.py`` (nothing fits); ``search_cache.py``: the search's
  shared cache and each point's own.
- The axes, one concept each: ``hardware.py`` (GPU presets), ``network.py`` (two levels,
  collectives), ``compute.py`` (per-op GEMM, attention, memory-bound time), ``tensor.py``
  (TP/SP), ``context.py`` (CP), ``sharding.py`` (DDP, ZeRO, FSDP, HSDP traffic and overlap),
  ``memory.py`` (model states, activations), ``axes.py`` (one point), ``parallel_costs.py``
  (a transformer's layers at one point), ``pipeline_axis.py`` (the simulator, called once).
- ``hfconfig.py``: a HuggingFace config.json as a shape; ``fit.py``: the efficiency from one
  measured step; ``published.py``: the published runs (data in ``bench/published/``) priced,
  the planner's check.
- ``settings.py``: a plan as torchtitan and Megatron-LM settings.
- ``frameworks.py``: framework profiles (Megatron-LM, torchtitan, DeepSpeed, NeMo): what each
  overlaps, how it reshards, which schedules and shardings it runs, the model states it
  keeps, its published efficiency fit per GPU; the ranking that puts its plans first.
- ``validate.py``: run plans for real (sleeping the profiled times) and compare.
"""
