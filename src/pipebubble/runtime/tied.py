"""Tied weights across stages: one weight used by several stages keeps one value.

A language model often uses its token table twice: the embedding looks tokens up in it on
the first stage, and the head multiplies by it on the last (``tie_word_embeddings``; GPT-2,
Qwen2-0.5B, Llama-3.2-1B). In one process the two uses are one ``nn.Parameter`` and autograd
adds their gradients. Cut into stages, the uses live on different ranks, so each rank holds
its own *copy*, and the copies stay one weight only if, before every optimizer step, each
copy's gradient is replaced by the sum over all copies (Megatron's embedding group: an
all-reduce among the ranks that hold a copy). The copies start equal, get the same gradient
and the same optimizer update, so they stay equal; the model trains as the tied model does.

This module does that in three pieces:

1. :func:`find_ties` finds the tied weights of a flat layer list: parameters that are one
   object under several model-wide names (``model.embed_tokens.tokens.weight`` and
   ``model.norm+lm_head.proj.weight``), plus any groups a :class:`~pipebubble.models.spec.
   ModelSpec` declares in ``ties`` (distinct parameters meant to be one weight: their shapes
   must agree, and the later ones start from the first one's value);
2. :func:`untie_stages` gives every stage that uses a tied weight a copy of its own (uses on
   one stage share one parameter, as in the model: at one stage the model is simply tied);
3. :func:`sum_tied_gradients` replaces each copy's gradient by the sum over the copies, here
   and, through ``all_reduce``, over the other ranks holding one (the distributed worker
   passes an all-reduce over the group of those ranks, after the data-parallel one).

>>> import torch
>>> from torch import nn
>>> emb, head = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
>>> head.weight = emb.weight                     # tied, as the user wrote it
>>> find_ties([emb, head], ["emb", "head"])
[TiedWeight(names=('emb.weight', 'head.weight'))]
>>> from pipebubble.runtime.stages import split_stages
>>> stages = split_stages([emb, head], 2, [1])
>>> copies = untie_stages(stages, [0, 1], ["emb", "head"], find_ties([emb, head], ["emb", "head"]))
>>> [(c.stage, c.path) for c in copies[0].copies]
[(0, 'layers.0.weight'), (1, 'layers.0.weight')]
>>> stages[0].layers[0].weight is stages[1].layers[0].weight
False
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import UserError


@dataclass(frozen=True)
class TiedWeight:
    """One weight used under several model-wide parameter names (the first is its name)."""

    names: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.names[0]


@dataclass(frozen=True)
class Copy:
    """Where one copy of a tied weight lives: the stage (of one model copy) and the
    parameter's path inside that stage's module (``layers.0.tokens.weight``)."""

    stage: int
    path: str


@dataclass(frozen=True)
class StageTie:
    """A tied weight after the cut: its copies, one per stage that uses it."""

    weight: TiedWeight
    copies: tuple[Copy, ...] = field(default_factory=tuple)

    @property
    def stages(self) -> list[int]:
        return sorted({c.stage for c in self.copies})


def _layer_params(layers: Sequence[nn.Module], names: Sequence[str]):
    """(layer index, model-wide name, parameter) of every use, duplicates included."""
    for i, layer in enumerate(layers):
        for pname, p in layer.named_parameters(remove_duplicate=False):
            yield i, f"{names[i]}.{pname}", p


def find_ties(layers: Sequence[nn.Module], names: Sequence[str],
              declared: Iterable[Sequence[str]] = ()) -> list[TiedWeight]:
    """The tied weights of a flat layer list, each with every name it is used under.

    A parameter object reached under several names is one weight (the model as the user
    has it). ``declared``: groups of names of distinct parameters to tie (a ModelSpec's
    ``ties``); each name must exist, and the shapes agree, else a one-line UserError naming
    the weight. A declared group's later parameters take the first one's value here, so the
    copies start equal. Groups sharing a name are merged.
    """
    by_name: dict[str, nn.Parameter] = {}
    by_obj: dict[int, list[str]] = {}
    for _, name, p in _layer_params(layers, names):
        by_name.setdefault(name, p)
        uses = by_obj.setdefault(id(p), [])
        if name not in uses:
            uses.append(name)
    groups = [list(g) for g in by_obj.values() if len(g) > 1]
    for group in declared:
        group = [str(n) for n in group]
        for n in group:
            if n not in by_name:
                valid = ", ".join(list(by_name)[:6])
                raise UserError(f"tied weight {group[0]!r}: the model has no parameter {n!r} "
                                f"(its names are the layer names and parameter paths, e.g. "
                                f"{valid})")
        first = by_name[group[0]]
        for n in group[1:]:
            p = by_name[n]
            if tuple(p.shape) != tuple(first.shape):
                raise UserError(f"tied weight {group[0]!r}: its copies differ in shape: "
                                f"{group[0]} is {list(first.shape)}, {n} is {list(p.shape)}; "
                                "tied copies must have one shape")
            if p is not first:
                with torch.no_grad():
                    p.copy_(first)
        groups.append(group)
    return [TiedWeight(tuple(g)) for g in _merge(groups)]


def _merge(groups: list[list[str]]) -> list[list[str]]:
    """Union of groups that share a name, each keeping the order names first appeared."""
    out: list[list[str]] = []
    for g in groups:
        hit = [o for o in out if set(o) & set(g)]
        merged = [n for o in hit for n in o]
        merged += [n for n in g if n not in merged]
        out = [o for o in out if o not in hit] + [merged]
    return out


def untie_stages(stages: Sequence[nn.Module], first_layers: Sequence[int],
                 names: Sequence[str], ties: Sequence[TiedWeight]) -> list[StageTie]:
    """Give each stage that uses a tied weight its own copy (in place); return the copies.

    ``stages[s]`` is a :class:`~pipebubble.runtime.pipeline.PipelineStage` whose first layer
    is ``first_layers[s]`` of the model. The first stage using a weight keeps the model's
    parameter; every later stage's uses are pointed at one clone of it (same value, its own
    storage and gradient). Uses on one stage stay one parameter. A module used on several
    stages (one layer applied twice, ALBERT-style) is copied whole for each later stage
    first, so that pointing one stage's use at its copy leaves the others' alone.
    """
    from .train import stage_layers

    _copy_shared_modules(stages)
    where: dict[str, tuple[int, str, nn.Module, str]] = {}
    for s, stage in enumerate(stages):
        for i, layer in enumerate(stage_layers(stage)):
            for mod_name, mod in layer.named_modules(remove_duplicate=False):
                for pname, _ in mod.named_parameters(recurse=False, remove_duplicate=False):
                    full = ".".join(x for x in (mod_name, pname) if x)
                    model_name = f"{names[first_layers[s] + i]}.{full}"
                    where.setdefault(model_name, (s, f"layers.{i}.{full}", mod, pname))
    out = []
    for tie in ties:
        uses = [where[n] for n in tie.names if n in where]
        if not uses:
            continue
        copies: list[Copy] = []
        first, origin = uses[0][0], getattr(uses[0][2], uses[0][3])
        clones: dict[int, nn.Parameter] = {}  # later stage -> its copy of ``origin``
        seen: set[int] = set()
        for s, path, mod, pname in uses:
            p = getattr(mod, pname)
            if p is origin and s != first:
                if s not in clones:
                    clones[s] = nn.Parameter(origin.detach().clone(),
                                             requires_grad=origin.requires_grad)
                    copies.append(Copy(s, path))
                setattr(mod, pname, clones[s])
            elif id(p) not in seen:  # the first stage's use, or a declared distinct one
                seen.add(id(p))
                copies.append(Copy(s, path))
        out.append(StageTie(tie, tuple(copies)))
    return out


def _copy_shared_modules(stages: Sequence[nn.Module]) -> None:
    """Replace each layer holding a module an earlier stage holds by a deep copy (in place)."""
    import copy

    held: set[int] = set()
    for stage in stages:
        inner = getattr(stage, "layers", None)
        mine: set[int] = set()
        if isinstance(inner, nn.Sequential):
            for i, layer in enumerate(list(inner)):
                if any(id(m) in held for m in layer.modules()):
                    inner[i] = layer = copy.deepcopy(layer)
                mine.update(id(m) for m in layer.modules())
        else:
            mine.update(id(m) for m in stage.modules())
        held |= mine


def tie_modules(layers: Sequence[nn.Module], names: Sequence[str],
                ties: Sequence[TiedWeight]) -> None:
    """Make every name of each tied weight one parameter in ``layers`` (in place): the
    unsplit reference of a model whose ties are declared rather than shared objects."""
    owner: dict[str, tuple[nn.Module, str]] = {}
    for i, layer in enumerate(layers):
        for mod_name, mod in layer.named_modules(remove_duplicate=False):
            for pname, _ in mod.named_parameters(recurse=False, remove_duplicate=False):
                full = ".".join(x for x in (names[i], mod_name, pname) if x)
                owner.setdefault(full, (mod, pname))
    for tie in ties:
        mod, pname = owner[tie.name]
        first = getattr(mod, pname)
        for n in tie.names[1:]:
            m, pn = owner[n]
            setattr(m, pn, first)


def copies_held(modules: Mapping[int, nn.Module], tie: StageTie, per: int
                ) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(this rank's primary copies, every copy it holds) of ``tie``. ``modules`` maps stage
    index to module; with several chains (DualPipe) stage ``s`` runs model stage
    ``s mod per``, and only the first chain's copy counts in the sum (the chains' copies
    already hold the same, summed gradient)."""
    primary, every, seen = [], [], set()
    for copy in tie.copies:
        for s, mod in sorted(modules.items()):
            if s % per != copy.stage:
                continue
            p = mod.get_parameter(copy.path)
            if id(p) in seen:
                continue
            seen.add(id(p))
            every.append(p)
            if s < per:
                primary.append(p)
    return primary, every


def sum_tied_gradients(modules: Mapping[int, nn.Module], ties: Sequence[StageTie],
                       per: int | None = None,
                       all_reduce: Callable[[int, torch.Tensor], None] | None = None) -> None:
    """Replace the gradient of every copy of each tied weight by the sum over the copies.

    ``modules``: stage index -> module of the stages held here (all of them locally; a
    rank's own in a distributed run); ``per``: stages of one model copy (default: all).
    ``all_reduce(i, tensor)``, when given, sums ``tensor`` in place over the other ranks
    holding copies of ``ties[i]`` (each rank passes its own copies' sum, zeros if it holds
    none of the first chain's). A copy without a gradient counts as zero.
    """
    per = per or (max(modules) + 1 if modules else 1)
    for i, tie in enumerate(ties):
        primary, every = copies_held(modules, tie, per)
        if not every:
            continue
        total = torch.zeros_like(every[0])
        for p in primary:
            if p.grad is not None:
                total += p.grad
        if all_reduce is not None:
            all_reduce(i, total)
        for p in every:
            if p.requires_grad:
                p.grad = total.clone()
