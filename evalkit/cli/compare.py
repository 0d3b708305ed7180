"""`evalkit compare RUN_A RUN_B --out DIR`: a drift report between two runs of one model."""
from __future__ import annotations

from evalkit.bootstrap import DEFAULT_BOOTSTRAP


def add_parser(sub) -> None:
    from evalkit.leaderboard.drift import DEFAULT_METRIC, JSON_NAME, MD_NAME

    p = sub.add_parser("compare", help="drift between two runs of the same model on the same "
                                       "probes under different settings (dtype, backend)")
    p.add_argument("run_a", metavar="RUN_A", help="finished run folder (the reference, e.g. fp32)")
    p.add_argument("run_b", metavar="RUN_B", help="finished run folder (e.g. bf16); delta = B - A")
    p.add_argument("--out", required=True, metavar="DIR",
                   help=f"folder for {MD_NAME} and {JSON_NAME} (other files are left alone)")
    p.add_argument("--metric", default=DEFAULT_METRIC,
                   help=f"the recall metric (default {DEFAULT_METRIC})")
    p.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP,
                   help=f"paired bootstrap resamples (default {DEFAULT_BOOTSTRAP})")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=run)


def run(args) -> int:
    from evalkit.leaderboard.drift import compare_runs, fmt_num, summary_rows, write_report

    report = compare_runs(args.run_a, args.run_b, args.metric, args.bootstrap, args.seed)
    paths = write_report(report, args.out)
    for r in summary_rows(report):
        print(f"{r['model']} [{r['settings']}] {r['task']}: {r['n_pairs']} pairs, recall "
              f"{fmt_num(r['recall_a'])} -> {fmt_num(r['recall_b'])} (delta "
              f"{fmt_num(r['delta'], signed=True)} [{fmt_num(r['ci_low'], signed=True)}, "
              f"{fmt_num(r['ci_high'], signed=True)}]), {r['lost']} lost / {r['gained']} gained, "
              f"{r['changed_answers']} answers changed, |delta log p(gold)| mean "
              f"{fmt_num(r['mean_abs_dlogprob'], '.3g')} max {fmt_num(r['max_abs_dlogprob'], '.3g')}")
    print(f"evalkit compare: wrote {paths[1]} and {paths[0]}")
    return 0
