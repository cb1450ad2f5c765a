"""What the user runs now: ``plan --config tp=8,pp=8,dp=24,...`` as restrictions of the search.

The keys are the axes of a plan (tp, sp, cp, pp, dp, ep, etp, sharding, mbs, schedule, v,
recompute; ``ep``, ``etp``: expert parallel and expert tensor parallel, MoE profiles only);
any subset may be given and the rest is searched. :func:`parse_config` checks the text (one
line naming the item and what is valid), :func:`restrict` narrows a planner Request to it.

>>> parse_config("tp=8,pp=2,sharding=zero1", gpus=64)
{'tp': 8, 'pp': 2, 'sharding': 'zero1'}
"""

from __future__ import annotations

from ..errors import UserError, param
from .dims import ParallelDims

CONFIG_KEYS = ("tp", "sp", "cp", "pp", "dp", "ep", "etp", "sharding", "mbs", "schedule", "v",
               "recompute")


def parse_config(text: str, gpus: int) -> dict:
    """``tp=8,pp=8,...`` as a dict of restrictions; the degrees must multiply into --gpus."""
    out: dict = {}
    if not text.strip(", \t"):
        raise UserError(f"{param('config')} {text!r} is empty; give KEY=VALUE items, e.g. "
                         f"tp=8,pp=2 (keys {', '.join(CONFIG_KEYS)})")
    for item in (x.strip() for x in text.split(",") if x.strip()):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or key not in CONFIG_KEYS or not value:
            raise UserError(f"{param('config')} item {item!r} must be KEY=VALUE with KEY one of "
                             f"{', '.join(CONFIG_KEYS)}")
        if key in out:
            raise UserError(f"{param('config')} gives {key} twice; give each key once")
        if key in ("tp", "cp", "pp", "dp", "ep", "etp", "mbs", "v", "sp"):
            if not value.isascii() or not value.isdigit():  # no "+2", "1_0", "٢"
                raise UserError(f"{param('config')} {key}={value[:40]!r} must be "
                                + ("0 or 1" if key == "sp" else "an integer >= 1"))
            if len(value.lstrip("0")) > 18:
                raise UserError(f"{param('config')} {key}: a {len(value)}-digit number is too "
                                f"large (the degrees multiply into {param('gpus')})")
            out[key] = int(value)
            if out[key] < (0 if key == "sp" else 1) or (key == "sp" and out[key] > 1):
                raise UserError(f"{param('config')} {key}={value} must be "
                                 + ("0 or 1" if key == "sp" else "an integer >= 1"))
        else:
            out[key] = value.lower()
    given = [k for k in ("tp", "cp", "pp", "dp") if k in out]
    dims = ParallelDims(**{k: out[k] for k in ("tp", "cp", "pp") if k in out},
                        dp_replicate=out.get("dp", 1))  # the degrees given, 1 for the rest
    prod = dims.world
    if gpus % prod or (len(given) == 4 and prod != gpus):
        shown = " x ".join(f"{k}={out[k]}" for k in ("tp", "cp", "pp", "dp") if k in out)
        raise UserError(f"{param('config')} {shown} = {prod} GPUs "
                         + ("!= " if len(given) == 4 else "does not divide ")
                         + f"{param('gpus')} {gpus}; tp x cp x pp x dp must equal {param('gpus')}")
    return out


def restrict(req, config: dict):  # -> Request (plan/planner.py)
    """The request limited to the configuration's values."""
    from dataclasses import replace

    ch = {}
    for key, field in (("tp", "tp"), ("cp", "cp"), ("pp", "pp"), ("dp", "dp"), ("ep", "ep"),
                       ("etp", "etp"),
                       ("mbs", "microbatch_sizes"), ("v", "chunks")):
        if key in config:
            ch[field] = (config[key],)
    if "sp" in config:
        ch["sp"] = (bool(config["sp"]),)
    if "sharding" in config:
        ch["shardings"] = (config["sharding"],)
    if "schedule" in config:
        ch["schedules"] = (config["schedule"],)
    if "recompute" in config:
        ch["recompute"] = (config["recompute"],)
    if "v" in config:
        ch["max_chunks"] = max(req.max_chunks, config["v"])
    ch["config"] = tuple(k for k in ("tp", "cp", "pp", "dp", "ep", "etp", "sharding")
                         if k in config)
    return replace(req, **ch)
