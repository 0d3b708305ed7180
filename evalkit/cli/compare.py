"""`evalkit compare RUN_A RUN_B --out DIR`: two models question by question, or one model's
drift between two runs under different settings."""
from __future__ import annotations

from evalkit.bootstrap import DEFAULT_BOOTSTRAP


def add_parser(sub) -> None:
    from evalkit.leaderboard.drift import DEFAULT_METRIC, JSON_NAME, MD_NAME
    from evalkit.leaderboard import paired

    p = sub.add_parser(
        "compare", help="two models question by question (paired table, McNemar, only-A "
                        "questions), or one model's drift between two runs (dtype, backend)",
        description="Two different models (one per run, or --models A,B): per task x length "
                    "and metric, both right / only A / only B / neither, McNemar's exact p and "
                    "the gap A - B with a paired bootstrap interval, and every question only A "
                    f"(the baseline) got right with the gold and both answers: {paired.MD_NAME} "
                    f"and {paired.JSON_NAME}. The same model in both runs: a drift report "
                    f"({MD_NAME}, {JSON_NAME}; `evalkit publish --compare DIR` shows it). "
                    "Example: evalkit compare runs/x runs/x --models recall-softmax-tiny,"
                    "recall-gla-tiny --out cmp/")
    p.add_argument("run_a", metavar="RUN_A", help="finished run folder (the baseline / reference)")
    p.add_argument("run_b", metavar="RUN_B", help="finished run folder (may be RUN_A again "
                                                  "with --models)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for the report files (other files are left alone)")
    p.add_argument("--models", metavar="A,B",
                   help="the model of RUN_A and the model of RUN_B to compare question by "
                        "question (needed when a run holds several)")
    p.add_argument("--metric", help=f"the recall metric (default: two models, the board's "
                                    f"default generation metric plus forced choice; drift, "
                                    f"{DEFAULT_METRIC})")
    p.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP,
                   help=f"paired bootstrap resamples (default {DEFAULT_BOOTSTRAP})")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=run)


def run(args) -> int:
    from evalkit.leaderboard import paired

    models = None
    if args.models is not None:
        models = [m.strip() for m in args.models.split(",")]
        if len(models) != 2 or not all(models):
            raise ValueError(f"--models {args.models!r}: expected A,B (the model of RUN_A, then "
                             f"the model of RUN_B)")
    if models or paired.two_models(args.run_a, args.run_b):
        return _two_models(args, models)
    return _drift(args)


def _two_models(args, models) -> int:
    from evalkit.formatting import markdown_table
    from evalkit.leaderboard import paired

    report = paired.compare_models(args.run_a, args.run_b, models, args.metric, args.bootstrap,
                                   args.seed)
    paths = paired.write_report(report, args.out)
    a, b = report["a"]["model"], report["b"]["model"]
    print(f"evalkit compare: {b} (B) against {a} (A, the baseline), "
          f"{report['n_scored_in_both']} questions scored by both")
    print(markdown_table(paired.HEADER, paired.table_rows(report)))
    print(f"evalkit compare: {len(report['only_a'])} (question, metric) only {a} got right, "
          f"with the gold and both answers, in {paths[1]}; wrote {paths[1]} and {paths[0]}")
    return 0


def _drift(args) -> int:
    from evalkit.leaderboard.drift import (DEFAULT_METRIC, compare_runs, fmt_num, summary_rows,
                                           write_report)

    report = compare_runs(args.run_a, args.run_b, args.metric or DEFAULT_METRIC, args.bootstrap,
                          args.seed)
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
