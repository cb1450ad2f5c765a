"""Megatron-LM SC'21 Table 1, predicted: calibrate on one row, predict the others.

Fits the compute model's efficiency (``plan --measured-step``) to one row's published
throughput (default the 18.4B row: TP 8, no pipeline), then plans every row at its published
TP, PP and data parallelism (microbatch size and interleaving chunks searched, full
recomputation, DDP, A100 80 GB preset) and prints published and predicted TFLOP/s per GPU
(eq. 3 of the paper) as a markdown table. The same numbers are checked by
tests/test_plan_megatron.py.

    python bench/bench_megatron.py [--calibrate-on 18.4B]
"""

from __future__ import annotations

import argparse
import time

from pipebubble.plan.published import TABLE1, predict_table1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate-on", default="18.4B", choices=[r.name for r in TABLE1])
    args = ap.parse_args()
    t0 = time.perf_counter()
    eff, rows = predict_table1(args.calibrate_on)
    print(f"efficiency fitted on the {args.calibrate_on} row: {eff:.3f} of 312 TFLOP/s for "
          f"large GEMMs ({time.perf_counter() - t0:.1f} s for the whole table)\n")
    print("| model | TP | PP | GPUs | batch | published TFLOP/s | predicted | error | "
          "planner's mbs, v |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mark = " (calibration)" if r["calibration"] else ""
        print(f"| {r['model']}{mark} | {r['tp']} | {r['pp']} | {r['gpus']} | {r['batch']} | "
              f"{r['published']} | {r['predicted']:.1f} | {r['error']:+.1%} | "
              f"{r['microbatch_size']}, {r['chunks']} |")
    worst = max(abs(r["error"]) for r in rows)
    print(f"\nlargest error {worst:.1%}")


if __name__ == "__main__":
    main()
