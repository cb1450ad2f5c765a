"""Planning: measure or model the layers, cut them into stages, choose a configuration.

- ``profile.py``: per-layer time, parameters and activation bytes (measured).
- ``partition.py``: the exact min-max partitioner (contiguous layers into stages).
- ``balance.py``: cutting by time, parameters or simulation; rebalancing from a measured run.
- ``layouts.py``: Megatron and torchtitan settings for a cut.
- ``calibrate.py``: per-stage costs from a measured timeline.
- ``measured.py``: rebalancing from measured stage times on real tensors.
- ``sweep.py``: step time and bubble over microbatches for several schedules.
"""
