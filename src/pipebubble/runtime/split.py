"""The split backward: I (input gradient) now, W (weight gradients) later.

Zero-bubble schedules (Qi et al. 2024) cut each stage's backward B in two. ``I`` computes the
gradient w.r.t. the stage input, which the previous stage is waiting for; ``W`` computes the
weight gradients, which nobody waits for, so a schedule can run it later in a bubble. For one
Linear ``y = x A^T + b`` with output gradient ``g``: I is ``dx = g A`` and W is
``dA = g^T x``, ``db = sum(g)``. W needs ``x`` and ``g``; nothing else of the graph.

This module does that split on any autograd graph, not only on Linear layers:

1. Classify the graph of the stage output. A *weight chain* is a node with one input that is
   a parameter or another weight chain (``A.t()``, ``positions[:n]``) and with exactly one
   consumer in the graph: it depends on weights only, and its gradient reaches it through
   one edge. A *boundary node* is any other node with an input that is a parameter or a
   weight chain: it mixes an activation with a weight (``addmm(b, x, A^T)``, a LayerNorm
   with its affine weights, ``emb + positions``).

   Why "one consumer": a weight-only node that feeds several others is an *activation*
   that happens to come from weights. The first stage of a language model is the case: the
   embedding lookup ``h = E[ids]`` depends on the embedding table alone (the token ids need
   no gradient), and ``h`` feeds the norm, the attention and the residual of the first
   decoder layer. Taken for a chain, W would run the whole layer's backward again from
   each of them (through tensors I has already freed, and counting the gradient of ``E``
   once per path). With the rule, the lookup is a boundary node like any other: I
   computes the gradient that flows into ``h`` (the activation work), W turns it into the
   table's gradient.
2. **I**: one ``torch.autograd.grad`` from the output to the stage input *and* to the
   gradient edges into every boundary node (what flows into it, ``g``), with the graph
   retained. Autograd computes only what these targets need, so a boundary node computes
   its activation gradient and not its weight gradient. Then every saved tensor except
   those of boundary nodes and weight chains is freed (see ``memory.SavedTensors``): I
   frees ``M_B - M_W`` and keeps ``M_W``, as in the paper's memory model.
3. **W**: for each boundary node, one ``torch.autograd.grad`` from its captured ``g`` to its
   weight inputs only (so it does not run the activation path again), then one pass from
   the weight-chain gradients down to the parameters. Gradients accumulate into ``.grad``.

   That W touches nothing but the boundary node and the weights below it holds when no
   parameter is reached from two boundary nodes one of which lies on the other's
   activation path (a weight used twice in one stage: a layer applied twice, an embedding
   tied to the head on the same stage). ``autograd.grad`` from the upper node to that
   parameter would also run the activation path down to the lower use (through freed
   tensors, counting the lower use twice). Such an upper node's W instead calls the node's
   own backward function alone (``node(*g)``), which computes the gradients of its inputs
   and nothing below them; the activation input's gradient it computes again is dropped
   (one operation's extra work, only for these nodes).

I followed by W gives the same gradients as the fused backward B (same operations, only the
summation order of ``.grad`` may differ in the last bit).

>>> import torch
>>> lin = torch.nn.Linear(3, 2)
>>> x = torch.randn(4, 3, requires_grad=True)
>>> saved = SavedTensors(lin.parameters())
>>> with saved:
...     y = lin(x)
>>> dx, work = backward_input(y, torch.ones(4, 2), x, saved)
>>> lin.weight.grad is None, work.nbytes == x.nbytes    # W keeps x, nothing ran yet
(True, True)
>>> work.run()
>>> torch.allclose(lin.bias.grad, torch.full((2,), 4.0))
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node

from ..errors import UserError
from .memory import SavedTensors


class SplitError(UserError):
    """A stage graph the split backward cannot separate into I and W (the message names the
    stage and the operation)."""


def _is_leaf(node: Node) -> bool:
    return hasattr(node, "variable")  # AccumulateGrad: the gradient sink of a leaf tensor


@dataclass
class WeightWork:
    """What I keeps for W: boundary nodes, the gradients that flowed into them, the memory."""

    boundary: list[tuple[Node, list[tuple[int, Node, int]], tuple[torch.Tensor | None, ...]]]
    saved: SavedTensors | None
    nbytes: int
    where: str = "the stage"
    direct: set = field(default_factory=set)  # nodes whose W calls their backward alone
    _done: bool = field(default=False, repr=False)

    def run(self) -> None:
        """Compute the weight gradients and accumulate them into the parameters' ``.grad``."""
        if self._done:
            raise RuntimeError("W already ran for this stage and microbatch")
        self._done = True
        chains: dict[tuple[Node, int], torch.Tensor] = {}
        for node, slots, grads in self.boundary:
            if all(g is None for g in grads):
                continue
            if node in self.direct:  # a reused weight (module docstring, step 3)
                every = node(*grads)
                every = (every,) if isinstance(every, torch.Tensor) else tuple(every)
                res = [_as_input(every[i], n, nr) for i, n, nr in slots]
            else:
                outs = [(GradientEdge(node, k), g) for k, g in enumerate(grads)
                        if g is not None]
                res = self._grad(node, [e for e, _ in outs],
                                 [GradientEdge(n, nr) for _, n, nr in slots],
                                 [g for _, g in outs])
            for (_, n, nr), g in zip(slots, res, strict=True):
                if g is None:
                    continue
                if _is_leaf(n):
                    _accumulate(n.variable, g)
                else:
                    key = (n, nr)
                    chains[key] = g if key not in chains else chains[key] + g
        if chains:
            keys = list(chains)
            params = _leaves_below([n for n, _ in keys])
            res = self._grad(keys[0][0], [GradientEdge(n, nr) for n, nr in keys], params,
                             [chains[k] for k in keys])
            for p, g in zip(params, res, strict=True):
                if g is not None:
                    _accumulate(p, g)
        self.boundary = []
        if self.saved is not None:
            self.saved.free()

    def _grad(self, node: Node, outputs: list, inputs: list, grads: list):
        try:
            return torch.autograd.grad(outputs, inputs, grad_outputs=grads, allow_unused=True)
        except RuntimeError as exc:  # a graph the classification above got wrong
            if "freed after the input-gradient pass" not in str(exc):
                raise
            raise SplitError(
                f"{self.where}: the split backward cannot compute the weight gradient (W) of "
                f"{node.name()}: it needs activations the input-gradient pass (I) freed; use a "
                "schedule with a fused backward (B), e.g. 1f1b") from None


def backward_input(
    output: torch.Tensor,
    grad: torch.Tensor | None,
    stage_input: torch.Tensor,
    saved: SavedTensors | None = None,
    where: str = "the stage",
) -> tuple[torch.Tensor | None, WeightWork]:
    """Run I: return the stage input's gradient (None if it needs none) and the W work.

    ``output`` is the stage output (or the loss, with ``grad=None``); ``saved`` the hooks the
    forward ran under, so that I can free what W does not need (without it, the whole graph
    stays alive until W). ``where`` names the stage in errors (``"stage 2"``).
    """
    root = output.grad_fn
    if root is None:
        return None, WeightWork([], saved, 0, where)
    nodes = _walk(root)
    consumers = _consumers(nodes)
    chain: dict[Node, bool] = {}

    def is_chain(n: Node) -> bool:  # depends on weights only, through one input each
        if n in chain:
            return chain[n]
        chain[n] = False  # guards against cycles (there are none in autograd graphs)
        nxt = n.next_functions
        ok = (not _is_leaf(n) and len(nxt) == 1 and nxt[0][0] is not None
              and len(consumers.get(n, ())) == 1
              and (_is_weight(nxt[0][0], stage_input) or is_chain(nxt[0][0])))
        chain[n] = ok
        return ok

    boundary: list[tuple[Node, list[tuple[int, Node, int]]]] = []
    for n in nodes:
        if _is_leaf(n) or is_chain(n):
            continue
        slots = [(i, f, nr) for i, (f, nr) in enumerate(n.next_functions)
                 if f is not None and (_is_weight(f, stage_input) or is_chain(f))]
        if slots:
            boundary.append((n, slots))
    direct = _upper_uses_of_reused_weights(nodes, consumers, chain, stage_input)
    targets: list[torch.Tensor | GradientEdge] = []
    wants_input = stage_input.requires_grad
    if wants_input:
        targets.append(stage_input)
    counts = []
    for n, _ in boundary:
        k = len(n._input_metadata)  # the node's forward outputs
        counts.append(k)
        targets.extend(GradientEdge(n, i) for i in range(k))
    grads: tuple[torch.Tensor | None, ...] = ()
    if targets:
        grads = torch.autograd.grad(
            output, targets, grad_outputs=grad, retain_graph=True, allow_unused=True
        )
    dx = grads[0] if wants_input else None
    pos = 1 if wants_input else 0
    kept = []
    for (n, slots), k in zip(boundary, counts, strict=True):
        kept.append((n, slots, tuple(grads[pos:pos + k])))
        pos += k
    nbytes = 0
    if saved is not None:
        w_nodes = [n for n, _ in boundary] + [n for n, ok in chain.items() if ok]
        nbytes = saved.keep_only(w_nodes)
    return dx, WeightWork(kept, saved, nbytes, where, direct)


def _is_weight(node: Node, stage_input: torch.Tensor) -> bool:
    return _is_leaf(node) and node.variable is not stage_input


def _consumers(nodes: list[Node]) -> dict[Node, list[Node]]:
    """For each node, the nodes of the graph whose backward feeds it (one entry per edge)."""
    out: dict[Node, list[Node]] = {}
    for n in nodes:
        for f, _ in n.next_functions:
            if f is not None:
                out.setdefault(f, []).append(n)
    return out


def _as_input(g: torch.Tensor | None, node: Node, nr: int) -> torch.Tensor | None:
    """A gradient computed by calling a node directly, shaped and typed as the engine would
    hand it to ``node`` (a broadcast bias gradient summed back to the bias's shape)."""
    if g is None:
        return None
    meta = node._input_metadata[nr]
    if tuple(g.shape) != tuple(meta.shape):
        g = g.sum_to_size(meta.shape)
    return g.to(meta.dtype) if g.dtype != meta.dtype else g


def _upper_uses_of_reused_weights(nodes, consumers, chain, stage_input) -> set[Node]:
    """Boundary nodes that reach, through their inputs, another boundary node using the same
    parameter: their W must not run ``autograd.grad`` (module docstring, step 3). Empty
    unless a weight is used twice in the stage; only then is anything walked."""
    owner: dict[Node, Node] = {}  # weight chain -> the boundary node that consumes it

    def owner_of(n: Node) -> Node:
        while chain.get(n, False):
            n = consumers[n][0]
        return n

    out: set[Node] = set()
    for n in nodes:
        if not _is_weight(n, stage_input):
            continue
        users = {owner.setdefault(c, owner_of(c)) for c in consumers.get(n, ())}
        if len(users) < 2:
            continue
        for a in users:
            below = set(_walk(a)) - {a}
            if any(b in below for b in users if b is not a):
                out.add(a)
    return out


def _walk(root: Node) -> list[Node]:
    seen: set[Node] = set()
    out: list[Node] = []
    stack = [root]
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        out.append(n)
        stack.extend(f for f, _ in n.next_functions)
    return out


def _leaves_below(nodes: list[Node]) -> list[torch.Tensor]:
    out, ids = [], set()
    for n in _walk_many(nodes):
        if _is_leaf(n) and id(n.variable) not in ids:
            ids.add(id(n.variable))
            out.append(n.variable)
    return out


def _walk_many(nodes: list[Node]) -> list[Node]:
    seen: set[Node] = set()
    out: list[Node] = []
    for root in nodes:
        for n in _walk(root):
            if n not in seen:
                seen.add(n)
                out.append(n)
    return out


def _accumulate(p: torch.Tensor, g: torch.Tensor) -> None:
    if p.grad is None:
        p.grad = g.detach().clone()
    else:
        p.grad.add_(g)
