"""Balance by compute, not by parameter count: the lesson's point, predicted and measured.

A small transformer language model whose embedding and output head each hold as many
parameters as several blocks. The embedding is a table lookup (almost no compute); the head
is a large matrix multiply plus the loss. Cut by parameters, the first stage gets the
embedding and few blocks and sits idle, while another stage is the bottleneck; cut by
measured time, the first stage takes more blocks. This script:

1. profiles every layer on one microbatch (``pipebubble.plan.profile``);
2. cuts the model into 4 stages by ``params`` and by ``time`` (exact min-max) and simulates
   1F1B for each cut: the *predicted* step times;
3. runs both cuts for real with the local runtime (measured per-stage clock), alternating,
   median of ``--repeats`` steps: the *measured* step times;
4. rebalances from the measured run of the ``params`` cut (measured stage times spread over
   the layers in proportion to the profile, then re-cut by time), predicts the improvement,
   runs the new cut and measures it.

Run: ``python examples/balance_transformer.py`` (about a minute on one CPU core).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console

from pipebubble.commands.partition import fmt_time, stages_table, summary_table
from pipebubble.commands.profile import profile_table
from pipebubble.models import transformer
from pipebubble.plan.balance import Options, balance, rebalance
from pipebubble.plan.measured import measure_plans
from pipebubble.plan.profile import profile_layers

MODEL = dict(layers=12, dim=128, heads=4, vocab=6144, seq=64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--microbatch-size", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--repeats", type=int, default=5, help="measured steps per cut (median)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save", metavar="DIR", help="write profile.json and the params cut's "
                    "measured timeline.json here (for pipebubble partition --measured)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()

    spec = transformer(**MODEL)
    gen = torch.Generator().manual_seed(0)
    x, y = spec.make_batch(args.microbatch_size * args.microbatches, gen)
    mb = args.microbatch_size
    profile = profile_layers(spec.layers, x[:mb], target=y[:mb], loss_fn=spec.loss_fn,
                             warmup=5, repeats=max(9, args.repeats),
                             metadata={"model": "transformer", "model_args": MODEL})
    console.print(profile_table(profile))

    options = Options(ranks=args.ranks, schedule=args.schedule, microbatches=args.microbatches)
    plans = balance(profile, options, methods=("params", "time"))
    console.print(stages_table(plans))
    console.print(summary_table(plans))

    console.print(f"\nrunning both cuts with the local runtime, {args.repeats} steps each ...")
    measured = measure_plans(plans, spec.layers, x, y, spec.loss_fn, repeats=args.repeats)
    by_params, by_time = plans
    p_pred, t_pred = by_params.predicted_step_time, by_time.predicted_step_time
    p_meas, t_meas = measured[0].step_time, measured[1].step_time
    console.print(f"step time by params: predicted {fmt_time(p_pred)}, measured {fmt_time(p_meas)}"
                  f" {spread(measured[0])}")
    console.print(f"step time by time:   predicted {fmt_time(t_pred)}, measured {fmt_time(t_meas)}"
                  f" {spread(measured[1])}")
    console.print(f"[bold]time cut is faster by {1 - t_pred / p_pred:.1%} predicted, "
                  f"{1 - t_meas / p_meas:.1%} measured[/bold] "
                  f"(params {by_params.ranges} vs time {by_time.ranges})")

    if args.save:
        out = Path(args.save)
        out.mkdir(parents=True, exist_ok=True)
        profile.save(out / "profile.json")
        tl = measured[0].timeline
        (out / "timeline.json").write_text(json.dumps(
            {**tl.summary(), "source": tl.source, "events": tl.events_json()}))
        cut = ",".join(f"{a}-{b}" for a, b in by_params.ranges)
        console.print(f"wrote {out}/profile.json and {out}/timeline.json; try: pipebubble "
                      f"partition --profile {out}/profile.json -p {args.ranks} --measured "
                      f"{out}/timeline.json --current-cut {cut}")

    console.print("\n[bold]rebalance from the measured run of the params cut[/bold]")
    _, before, after = rebalance(profile, by_params, measured[0].timelines)
    console.print(stages_table([before, after]))
    console.print(f"predicted: {fmt_time(before.predicted_step_time)} -> "
                  f"{fmt_time(after.predicted_step_time)} "
                  f"({1 - after.predicted_step_time / before.predicted_step_time:.1%} faster); "
                  f"new cut {after.ranges}")
    again = measure_plans([by_params, after], spec.layers, x, y, spec.loss_fn,
                          repeats=args.repeats)
    console.print(f"measured:  {fmt_time(again[0].step_time)} {spread(again[0])} -> "
                  f"{fmt_time(again[1].step_time)} {spread(again[1])} "
                  f"({1 - again[1].step_time / again[0].step_time:.1%} faster)")


def spread(m) -> str:
    return f"(median of {len(m.step_times)}; {fmt_time(min(m.step_times))} to " \
           f"{fmt_time(max(m.step_times))})"


if __name__ == "__main__":
    main()
