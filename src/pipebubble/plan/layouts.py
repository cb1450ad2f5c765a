"""Write a cut in the forms other tools take, ready to paste.

- :func:`layer_lists`: the layer indices of each stage.
- :func:`megatron_layout`: Megatron-LM's ``--pipeline-model-parallel-layout`` string: stages
  split by ``|``, ``E`` the embedding, ``t`` a transformer layer, ``L`` the loss (with the
  output layer), runs written ``t*3``. Stages are listed in stage order, which for
  interleaved (loop) placement is Megatron's order: every rank's first chunk, then every
  rank's second. Symbols come from each layer's ``role`` in the profile (written by the
  profiler from the model: ``embedding`` is ``E``, ``head`` on the last layer is ``L``),
  never from a class name. A profile without roles (another tool's file) falls back to the
  layer's ``type``: one containing "emb" is ``E``, a last layer whose type contains "head",
  "output" or "loss" is ``L``. Everything else is ``t``.
- :func:`megatron_flags`: ``--decoder-first-pipeline-num-layers`` and
  ``--decoder-last-pipeline-num-layers`` (transformer layers only) when the middle stages
  hold equal numbers of them, every stage holds at least one, and there is one chunk per
  rank; otherwise None (the layout string still says it).
- :func:`torchtitan_fqns`: torchtitan's ``module_fqns_per_model_part``, the layer (module)
  names of each stage, as a TOML line for the ``[parallelism]`` table: every top-level
  module, for torchtitan drops one that no part names without an error. A layer made of
  several modules lists each of them: one named ``model.norm+lm_head``, or one whose profile
  entry lists its ``modules`` (the analytic head ``output`` is ``norm`` and ``output``).

>>> from pipebubble.plan.profile import LayerProfile, Profile
>>> prof = Profile([LayerProfile(n, 1, 1, 1, 0, 0, t) for n, t in
...                 [("tok_embeddings", "Embedding"), ("layers.0", "Block"),
...                  ("layers.1", "Block"), ("layers.2", "Block"), ("output", "Head")]])
>>> megatron_layout(prof, [(0, 1), (2, 2), (3, 4)])
'Et|t|tL'
>>> megatron_flags(prof, [(0, 1), (2, 2), (3, 4)])
'--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1'
>>> torchtitan_fqns(prof, [(0, 1), (2, 4)])
'module_fqns_per_model_part = [["tok_embeddings", "layers.0"], ["layers.1", "layers.2", "output"]]'
>>> torchtitan_fqns(prof, [(0, 1), (2, 4)], head="lm_head")[-36:]
'["layers.1", "layers.2", "lm_head"]]'
"""

from __future__ import annotations

import json

from .partition import Ranges
from .profile import Profile


def layer_lists(ranges: Ranges) -> list[list[int]]:
    return [list(range(a, b + 1)) for a, b in ranges]


def megatron_symbols(profile: Profile) -> list[str]:
    """One Megatron layout symbol per layer: E, t or L (see the module docstring).

    >>> from pipebubble.plan.profile import LayerProfile, Profile
    >>> prof = Profile([LayerProfile(n, 1, 1, 1, 0, 0, t, {"role": r}) for n, t, r in
    ...                 [("emb", "Emb", "embedding"), ("h.0", "Block", "layer"),
    ...                  ("out", "Proj", "head")]])
    >>> megatron_symbols(prof)
    ['E', 't', 'L']
    """
    out = []
    last = len(profile) - 1
    roles = [layer.extra.get("role") for layer in profile.layers]
    if any(r is not None for r in roles):
        return ["E" if r == "embedding" else "L" if r == "head" and i == last else "t"
                for i, r in enumerate(roles)]
    for i, layer in enumerate(profile.layers):
        kind = (layer.type or "").lower()
        if "emb" in kind:
            out.append("E")
        elif i == last and any(w in kind for w in ("head", "output", "loss")):
            out.append("L")
        else:
            out.append("t")
    return out


def megatron_layout(profile: Profile, ranges: Ranges) -> str:
    sym = megatron_symbols(profile)
    stages = []
    for a, b in ranges:
        runs: list[list] = []
        for s in sym[a:b + 1]:
            if runs and runs[-1][0] == s:
                runs[-1][1] += 1
            else:
                runs.append([s, 1])
        stages.append("".join(s if n == 1 else f"{s}*{n}" for s, n in runs))
    return "|".join(stages)


def megatron_flags(profile: Profile, ranges: Ranges, chunks: int = 1) -> str | None:
    """First/last-stage transformer-layer counts, or None when Megatron cannot express it."""
    if chunks != 1 or len(ranges) < 2:
        return None
    sym = megatron_symbols(profile)
    counts = [sym[a:b + 1].count("t") for a, b in ranges]
    if len(set(counts[1:-1])) > 1 or 0 in counts:
        return None  # uneven middle stages or an empty one: use the layout string
    return (f"--decoder-first-pipeline-num-layers {counts[0]} "
            f"--decoder-last-pipeline-num-layers {counts[-1]}")


def torchtitan_fqns(profile: Profile, ranges: Ranges, head: str = "output") -> str:
    """The TOML line (``head``: the name of the output module, ``output`` in torchtitan 0.2,
    ``lm_head`` in 0.3, which renames a top-level ``output``)."""
    mods = [[head if m == "output" else m for m in
             (layer.extra.get("modules") or layer.name.split("+"))] for layer in profile.layers]
    names = [[fqn for i in range(a, b + 1) for fqn in mods[i]] for a, b in ranges]
    return "module_fqns_per_model_part = " + json.dumps(names)
