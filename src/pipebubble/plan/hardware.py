"""GPU presets: what the compute model and the network need to know about one accelerator.

Each preset is a vendor data sheet's dense (no sparsity) bf16 peak, memory and HBM bandwidth,
the usual node (8 GPUs), the in-node link per GPU and one direction (NVLink / Infinity
Fabric) and the usual scale-out: ``nics_per_node`` NICs a node (8 on DGX/HGX nodes: one per
GPU) of ``inter_node_bandwidth`` each (one NIC's rate; a group that crosses nodes drives as
many of a node's NICs as it has members there, :mod:`pipebubble.plan.network`), plus
latencies and two fractions that real collectives and GEMMs reach:

- ``bus_fraction``: the share of the link rate a ring collective's "bus bandwidth" reaches
  (nccl-tests report ~75-85 % on NVLink and InfiniBand; 0.8 assumed);
- ``efficiency``: the fraction of peak a large bf16 GEMM reaches (A100 ~0.8 of 312,
  H100 ~0.7 of 989 in cuBLAS benchmarks). The compute model lowers it for small or skinny
  GEMMs (:mod:`pipebubble.plan.compute`); ``plan --efficiency`` overrides it and
  ``plan --config ... --measured-step S`` fits it to one measured run.

One field says how the framework uses the links: ``tp_overlap`` (on by default), whether
the backward's TP collectives run behind weight-gradient GEMMs (:mod:`pipebubble.plan.tensor`)
as Megatron-LM does since September 2021 (merge request 316, "allreduce overlap with wgrad
gemm"); off for runs made before that (Megatron-LM's SC'21 Table 1). Another,
``grad_accumulation_bytes`` (0 by default), is the HBM traffic per local parameter that each
microbatch's backward adds to accumulate its gradients outside the weight-gradient GEMM:
0 where the GEMM accumulates into the gradient buffer itself (Megatron-LM's gradient
accumulation fusion: the weight-gradient GEMM adds into the fp32 main gradient);
DeepSpeed's BF16 optimizer under its pipeline engine (BLOOM) copies each microbatch's bf16
gradient to fp32 and adds it to the fp32 accumulator after every backward
(``runtime/pipe/engine.py`` ``_exec_backward_pass`` calls
``update_hp_grads``; ``runtime/bf16_optimizer.py``: ``hp_grad.add_(lp.grad.to(fp32))``):
read 2 and write 4 bytes for the copy, read 4 + 4 and write 4 for the add, 18 bytes
(:mod:`pipebubble.plan.parallel_costs` adds it to each layer's W).

``fp8_peak_flops`` is the dense FP8 tensor-core peak (``plan --precision fp8`` runs the
GEMMs of the blocks there, :mod:`pipebubble.plan.compute`): twice the bf16 peak on Hopper
(H100 and H200 SXM: 1,979 TFLOP/s, NVIDIA's H100 data sheet, without sparsity), 4,500 on
B200 (NVIDIA's HGX B200 figure: 36 PFLOP/s FP8 dense for 8 GPUs), 2,615 on MI300X (AMD's
data sheet: 2,614.9 TFLOP/s dense FP8); 0 where the tensor cores have no FP8 (A100), and
``--precision fp8`` is refused there.

``loss_bytes`` (0 by default) is memory, not traffic: the bytes a logit (a token and
vocabulary entry on the rank) that the loss holds while it runs beyond the fp32
probabilities every head keeps for the backward: the framework profile sets it
(:mod:`pipebubble.plan.frameworks`: 8 for torchtitan's eager cross-entropy, 2 for
Megatron-LM's in-place vocabulary-parallel one), and the head's layer counts it as its
backward's transient (:mod:`pipebubble.plan.parallel_costs`).

Every numeric field but ``grad_accumulation_bytes`` and ``loss_bytes`` (library fields, like
``tp_overlap``)
can be overridden from the command line (``--peak-tflops``, ``--fp8-peak-tflops``, ``--gpu-memory``,
``--hbm-bandwidth``, ``--gpus-per-node``, ``--nvlink-bandwidth``, ``--nvlink-latency``,
``--inter-node-bandwidth``, ``--inter-node-latency``, ``--nics-per-node``; overriding
``--gpus-per-node`` alone keeps the preset's NICs per GPU).

>>> h = get_hardware("h100-sxm")
>>> h.peak_flops / 1e12, round(h.memory / 2**30, 2), h.gpus_per_node
(989.0, 79.65, 8)
>>> h.nics_per_node, h.inter_node_bandwidth / 1e9  # 8 x 400 Gb/s NDR a node
(8, 50.0)
>>> round(h.fp8_peak_flops / h.peak_flops, 3), get_hardware("a100-80gb").fp8_peak_flops
(2.001, 0.0)
>>> a = get_hardware("a100-80gb", gpus_per_node=4)
>>> a.gpus_per_node, a.nics_per_node
(4, 4)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from ..errors import ParamError, UserError, param
from ..params import check_real

GB = 1e9
GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class Hardware:
    """One GPU and its links. Bandwidths in bytes/s per GPU and direction, latency in s."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory: float  # bytes
    hbm_bandwidth: float
    gpus_per_node: int
    nvlink_bandwidth: float
    nvlink_latency: float
    inter_node_bandwidth: float
    inter_node_latency: float
    efficiency: float  # fraction of peak large GEMMs reach
    bus_fraction: float = 0.8  # fraction of the link rate ring collectives reach
    tp_overlap: bool = True  # backward TP collectives behind weight gradients (tensor.py)
    grad_accumulation_bytes: float = 0.0  # HBM bytes per local parameter per backward
    loss_bytes: float = 0.0  # bytes a local logit the loss holds beyond its kept fp32
    # probabilities while it runs (the head's transient; plan/frameworks.py sets it)
    nics_per_node: int = 8  # scale-out NICs a node, each at inter_node_bandwidth
    fp8_peak_flops: float = 0.0  # dense FP8 FLOP/s; 0: no FP8 tensor cores
    tp_comm_overlap: bool = False  # TP collectives pipelined with their GEMMs (tensor.py:
    # Megatron-LM's --tp-comm-overlap, torchtitan's AsyncTP; plan --tp-overlap on)

    def check(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "name":
                continue
            if f.name in ("tp_overlap", "tp_comm_overlap"):
                if not isinstance(v, bool):
                    raise UserError(f"{f.name} must be true or false, got {v!r}")
                continue
            if f.name in ("gpus_per_node", "nics_per_node"):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ParamError(f"{param(f.name)} must be an integer >= 1, got {v!r}")
                continue
            if f.name == "fp8_peak_flops" and v == 0:
                continue  # no FP8 tensor cores
            if f.name in _RANGES:  # the ranges of params.REALS
                name, scale = _RANGES[f.name]
                check_real(v * scale if isinstance(v, int | float) else v, name)
                continue
            if not (v >= 0 and math.isfinite(v)):
                raise ParamError(f"{param(f.name)} must be a finite number >= 0, got {v!r}")


_RANGES = {"peak_flops": ("peak_tflops", 1e-12), "memory": ("gpu_memory", 1.0),
           "fp8_peak_flops": ("fp8_peak_tflops", 1e-12),
           "hbm_bandwidth": ("hbm_bandwidth", 1.0),
           "nvlink_bandwidth": ("nvlink_bandwidth", 1.0),
           "nvlink_latency": ("nvlink_latency", 1.0),
           "inter_node_bandwidth": ("inter_node_bandwidth", 1.0),
           "inter_node_latency": ("inter_node_latency", 1.0),
           "efficiency": ("efficiency", 1.0), "bus_fraction": ("bus_fraction", 1.0)}
"""Each numeric field's parameter name in :data:`pipebubble.params.REALS` (the planner's
name for it: ``peak_tflops``, ``gpu_memory``) and the field's value in that parameter's unit
(FLOP/s x 1e-12 is TFLOP/s): the range the field must lie in, and the name its error marks
(:func:`pipebubble.errors.param`; the command line writes it as its flag)."""


def _gpu(name, tflops, mem_gb, hbm_tbs, nvlink_gbs, net_gbs, eff, mem_unit=GIB, fp8=0.0):
    return Hardware(name, tflops * 1e12, mem_gb * mem_unit, hbm_tbs * 1e12, 8,
                    nvlink_gbs * GB, 2e-6, net_gbs * GB, 5e-6, eff, fp8_peak_flops=fp8 * 1e12)


PRESETS: dict[str, Hardware] = {h.name: h for h in (
    # name          TFLOP/s  mem  HBM TB/s  NVLink GB/s  per-GPU NIC GB/s  GEMM eff.  (FP8)
    _gpu("a100-40gb", 312, 40, 1.555, 300, 25, 0.80),   # NVLink3, 200 Gb/s HDR; no FP8
    _gpu("a100-80gb", 312, 80, 2.039, 300, 25, 0.80),
    _gpu("h100-sxm", 989, 81559, 3.35, 450, 50, 0.70, MIB, fp8=1979),  # NVLink4, 400 Gb/s NDR
    _gpu("h200", 989, 143771, 4.8, 450, 50, 0.70, MIB, fp8=1979),
    _gpu("h800", 989, 81559, 3.35, 200, 50, 0.70, MIB, fp8=1979),  # H100, NVLink cut to 400 bidir.
    _gpu("b200", 2250, 180, 8.0, 900, 50, 0.70, GB, fp8=4500),    # NVLink5, 400 Gb/s
    _gpu("mi300x", 1307, 192, 5.3, 448, 50, 0.60, GB, fp8=2615),  # Infinity Fabric
)}
"""The presets. Memory is what the driver reports (NVML, ``nvidia-smi``) where known: A100
80 GB and 40 GB 81,920 and 40,960 MiB (80 and 40 GiB), H100 80 GB 81,559 MiB (79.65 GiB, not
80), H200 143,771 MiB (140.4 GiB, not 141 GB) (Modal, "Why does an NVIDIA H100 80GB card offer
85.52 GB?", their table of NVML totals); the vendor's GB for B200 and MI300X.

H800 (SXM) is the H100 SXM's die, compute, HBM and memory with NVLink cut from 900 to 400
GB/s, both directions together (NVIDIA's H800 product brief): 200 GB/s one way, and one 400
Gb/s InfiniBand NIC a GPU. DeepSeek-V3's report (arXiv 2412.19437, section 3.2.2) measures
"NVLink ... 160 GB/s, roughly 3.2 times that of IB (50 GB/s)" on its H800 cluster: 200 GB/s x
the 0.8 bus fraction is that 160."""


def get_hardware(name: str, **overrides) -> Hardware:
    """The preset ``name`` with ``overrides`` (None values ignored), checked."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise UserError(f"unknown {param('gpu')} {name!r}; valid are {', '.join(PRESETS)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    base = PRESETS[key]
    if "gpus_per_node" in given and "nics_per_node" not in given:
        g = given["gpus_per_node"]  # the preset's NICs per GPU, on a node of g GPUs
        if isinstance(g, int) and not isinstance(g, bool) and g >= 1:
            given["nics_per_node"] = max(1, round(base.nics_per_node * g / base.gpus_per_node))
    hw = replace(base, **given)
    hw.check()
    return hw
