"""Executors: run a Schedule on real tensors (one process now; torch.distributed later).

The stage interpreter (``interpreter.py``) has one handler per action kind and does not know
which schedule it runs; tensors reach it through a transport (``transport.py``).
"""
