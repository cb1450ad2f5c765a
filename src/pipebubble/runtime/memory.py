"""Measuring the activation memory a stage holds for its backward.

A forward keeps tensors alive for the backward: autograd *saves* them on the graph (a Linear
keeps its input, a GELU its input, a loss its prediction and target). That is what the
Zero Bubble paper calls ``M_B`` per microbatch, and what pipelining multiplies by the number
of microbatches in flight.

:class:`SavedTensors` is a pair of ``torch.autograd.graph.saved_tensors_hooks``: while a
forward runs inside ``with saved:``, every tensor autograd saves is wrapped in a small box
and its bytes are counted once (parameters are not activations and are left out). Boxes
also let the split backward free exactly what W does not need: after I, the boxes of the
graph nodes W will not run are emptied, and their tensors go back to the allocator.

>>> import torch
>>> lin = torch.nn.Linear(4, 4)
>>> saved = SavedTensors(exclude=lin.parameters())
>>> with saved:
...     y = torch.tanh(lin(torch.randn(2, 4)))   # Linear saves its input, tanh its output
>>> saved.nbytes                                   # 2 x (2 x 4 floats x 4 bytes)
64
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.autograd.graph import Node


class _Box:
    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor | None):
        self.tensor = tensor


class SavedTensors(torch.autograd.graph.saved_tensors_hooks):
    """Count (and box) the tensors autograd saves inside ``with``; see the module docstring."""

    def __init__(self, exclude: Iterable[torch.Tensor] = (), storages: set[int] | None = None):
        self.boxes: list[_Box] = []
        self.nbytes = 0
        self._seen: set[tuple[int, int]] = set()
        self._exclude = storages if storages is not None else param_storages(exclude)
        self._touched: list[_Box] = []
        super().__init__(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> _Box:
        box = _Box(t)
        self.boxes.append(box)
        if _storage(t) not in self._exclude:
            key = (t.data_ptr(), t.nbytes)
            if key not in self._seen:
                self._seen.add(key)
                self.nbytes += t.nbytes
        return box

    def _unpack(self, box: _Box) -> torch.Tensor:
        self._touched.append(box)
        if box.tensor is None:
            raise RuntimeError("this saved tensor was freed after the input-gradient pass (I)")
        return box.tensor

    def keep_only(self, nodes: Iterable[Node]) -> int:
        """Free every saved tensor except those of ``nodes``; return the bytes still held."""
        self._touched = []
        for node in nodes:
            for name in saved_names(node):
                try:
                    getattr(node, name)
                except RuntimeError:
                    continue
        keep = {id(b) for b in self._touched}
        self._touched = []
        held, seen = 0, set()
        for box in self.boxes:
            t = box.tensor
            if t is None:
                continue
            if id(box) not in keep:
                box.tensor = None
            elif _storage(t) not in self._exclude and (t.data_ptr(), t.nbytes) not in seen:
                seen.add((t.data_ptr(), t.nbytes))
                held += t.nbytes
        self.boxes = [b for b in self.boxes if b.tensor is not None]
        return held

    def free(self) -> None:
        for box in self.boxes:
            box.tensor = None
        self.boxes = []


_NAMES: dict[type, tuple[str, ...]] = {}


def saved_names(node: Node) -> tuple[str, ...]:
    """The ``_saved_*`` attributes of a graph node (the tensors its backward reads)."""
    cls = type(node)
    names = _NAMES.get(cls)
    if names is None:
        names = tuple(n for n in dir(node) if n.startswith("_saved_"))
        _NAMES[cls] = names
    return names


def graph_bytes(y: torch.Tensor, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of tensors the autograd graph of ``y`` keeps for the backward (a walk).

    Sums the saved tensors of every node reachable from ``y.grad_fn``, each (address, size)
    once, parameters (storages of ``exclude``) left out. Equals ``SavedTensors.nbytes`` of
    the same forward; slower (it visits every attribute), but needs no hooks.
    """
    skip = {_storage(p) for p in exclude}
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [y.grad_fn] if y.grad_fn is not None else []
    visited: set[int] = set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in visited:
            continue
        visited.add(id(fn))
        for name in saved_names(fn):
            try:
                val = getattr(fn, name)
            except RuntimeError:
                continue
            for t in val if isinstance(val, tuple | list) else (val,):
                if isinstance(t, torch.Tensor) and _storage(t) not in skip:
                    key = (t.data_ptr(), t.nbytes)
                    if key not in seen:
                        seen.add(key)
                        total += t.nbytes
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return total


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def param_storages(params: Iterable[torch.Tensor]) -> set[int]:
    """Storage addresses of ``params``: tensors saved from them are weights, not activations."""
    return {_storage(p) for p in params}


class AllocatorPeaks:
    """CUDA allocator peaks per action: ``torch.cuda.max_memory_allocated`` around each one.

    On CPU (or without CUDA) it records nothing. In one process (the local executor) every
    rank shares the device, so the peak is the device's, not one rank's.
    """

    def __init__(self, device: torch.device | str | None):
        dev = torch.device(device) if device is not None else None
        self.device = dev if dev is not None and dev.type == "cuda" else None
        self.peaks: list[int] = []

    def __enter__(self) -> AllocatorPeaks:
        if self.device is not None:
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device is not None:
            self.peaks.append(torch.cuda.max_memory_allocated(self.device))

    @property
    def peak(self) -> int | None:
        return max(self.peaks) if self.peaks else None
