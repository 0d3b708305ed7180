"""`evalkit publish RUN_DIR... --to DIR`: tables, CSV/JSON and plots from finished runs."""
from __future__ import annotations

import sys

from evalkit.bootstrap import DEFAULT_BOOTSTRAP
from evalkit.leaderboard.derived import DEFAULT_THRESHOLD
from evalkit.leaderboard.served import DEFAULT_SLO_S
from evalkit.scoring import recall_preference


def add_parser(sub) -> None:
    p = sub.add_parser("publish", help="build the leaderboard (README, CSV/JSON, plots, "
                                       "index.html) from finished runs")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="finished run folders (with DONE), or a folder of them (runs/)")
    p.add_argument("--to", required=True, metavar="DIR",
                   help="leaderboard folder to (re)write atomically, e.g. leaderboard/")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"recall bar for the effective length (default {DEFAULT_THRESHOLD})")
    p.add_argument("--primary-metric", help="recall metric for every task that has it "
                                            "(default: the first a task has of "
                                            f"{', '.join(recall_preference())}); the gap "
                                            "tables and the headline show forced choice "
                                            "beside it either way")
    p.add_argument("--gap", action="append", default=[], metavar="BASELINE:MODEL",
                   help="a recall-gap pair (repeatable; default: kv/kv-window baselines vs. "
                        "recurrent models, plus oracle vs. forgetful)")
    p.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP,
                   help=f"paired bootstrap resamples per gap cell (default {DEFAULT_BOOTSTRAP})")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--slo", type=float, default=DEFAULT_SLO_S, metavar="SECONDS",
                   help="served models' response-time objective for goodput (correct answers "
                        f"within it per second; default {DEFAULT_SLO_S:g})")
    p.add_argument("--compare", action="append", default=[], metavar="DIR",
                   help="a drift report folder from `evalkit compare` to include "
                        "(repeatable): a README section, drift.json and drift.csv")
    p.set_defaults(func=run)


def run(args) -> int:
    from evalkit.leaderboard import Options, publish
    from evalkit.leaderboard.readme import board_silent_tasks

    opts = Options(threshold=args.threshold, primary_metric=args.primary_metric,
                   gap_pairs=tuple(args.gap), n_boot=args.bootstrap, seed=args.seed,
                   slo_s=args.slo)
    res = publish(args.runs, args.to, opts, compare=args.compare)
    b = res.board
    print(f"published {len(b.rows)} rows ({b.samples['model_label'].nunique()} models, "
          f"{len(b.tasks)} tasks, {len(b.merged.runs)} runs) to {res.path}: "
          f"{sum(f.suffix == '.png' for f in res.files)} plots"
          + (f", {len(res.skipped)} skipped" if res.skipped else "")
          + f"; the page: {res.path / 'index.html'}")
    silent = board_silent_tasks(b)
    if silent:
        print(f"evalkit publish: no model answered {', '.join(silent)} by generation (every "
              f"score 0.00): only forced choice tells the models apart there; see "
              f"{res.path / 'README.md'}", file=sys.stderr)
    return 0
