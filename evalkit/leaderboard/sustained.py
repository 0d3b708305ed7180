"""What a served model sustains, read from its closed-loop run, and whether the board's Poisson
rates lie one below and one above it.

A closed loop keeps C requests in flight, the next sent when one ends, so by Little's law it
completes C / mean(response time) requests per second, and of those the answered ones: C x
answered / sum(response times) answers per second, the rate the server sustains at that
concurrency. A failed request held its slot until its failure, so its time counts
(evalkit.cell_stats.response_time; a request never sent held none). An open loop offered less than that keeps up (response time near the service
time); offered more, its queue grows for as long as requests keep coming, and the response
time from arrival with it. The served board's two Poisson rates must fall one on each side, or
its "above saturation" column is not (make standard-served checks this between its runs).
A sample's response time is its answer's; with forced choice on it holds its slot longer (one
more request per candidate after the answer), so such a loop is refused: the board runs its
loaded cells with `forced_choice: false`, one request per sample.

    python -m evalkit.leaderboard.sustained runs/served/mamba2/closed-4 recall-mamba2-tiny-vllm \
        --rates "2 40"
    recall-mamba2-tiny-vllm under closed:4: 200 answered, mean response time 0.41 s -> it
    sustains 9.76 requests/s; poisson 2/s is below, 40/s above
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from evalkit.cell_stats import response_time
from evalkit.leaderboard.load import read_samples


def sustained(run_dir: Path, model: str) -> tuple[float, str]:
    """(requests per second the model's closed loop sustained, a line saying how)."""
    path = Path(run_dir) / "samples.jsonl"
    if not path.is_file():
        raise ValueError(f"{path}: no such file (a finished closed-loop run's folder expected)")
    rows = [r for r in read_samples(path) if r["model"] == model]
    if not rows:
        raise ValueError(f"{path}: no samples of model {model!r}")
    loads = {r.get("arrivals") for r in rows}
    if len(loads) != 1 or not str(next(iter(loads))).startswith("closed:"):
        raise ValueError(f"{path}: model {model!r} was not run in one closed loop (its loads: "
                         f"{sorted(map(str, loads))}); the rate is read from `closed:C`")
    load = str(next(iter(loads)))
    c = int(load.split(":", 1)[1])
    ok = [r for r in rows if not r.get("error") and not r.get("flag")]
    extra = sorted({r.get("requests") for r in ok} - {1, None})
    if extra:
        raise ValueError(f"{path}: samples of {model!r} sent {extra} requests each (forced "
                         f"choice on): the answer's response time is not the time a sample "
                         f"held its place in the loop; run the closed loop with "
                         f"forced_choice: false")
    done = [float(r["latency_s"]) for r in ok]
    if len(done) < 10 or not all(math.isfinite(x) and x > 0 for x in done):
        raise ValueError(f"{path}: {len(done)} answered samples of {model!r} with a positive "
                         f"response time; at least 10 are needed to measure a rate")
    bad = [r for r in rows if r.get("error")]
    held = done + [t for r in bad if (t := response_time(r.get("latency_s"), r["error"],
                                                          r.get("attempts"))) is not None]
    mean = sum(held) / len(held)
    rate = c / mean * (len(done) / len(held))  # answers per second; = c / mean without failures
    failed = f", {len(bad)} failed" if bad else ""
    return rate, (f"{model} under {load}: {len(done)} answered{failed}, mean response time "
                  f"{mean:.3g} s -> it sustains {rate:.3g} requests/s")


def check_rates(rate: float, rates: Sequence[float]) -> str:
    """'' when some rate is below `rate` and some above it; else what is wrong."""
    below, above = [r for r in rates if r < rate], [r for r in rates if r > rate]
    if below and above:
        return ""
    side = "above" if not above else "below"
    return (f"no Poisson rate {side} the sustained {rate:.3g}/s among {list(rates)}: the board "
            f"needs one below and one above it (set the rates, e.g. "
            f"{rate / 4:.2g} and {rate * 4:.2g})")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evalkit.leaderboard.sustained",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a finished closed-loop run's folder")
    p.add_argument("model", help="the served model's name in that run")
    p.add_argument("--rates", default="", help='the Poisson rates to check, e.g. "0.05 0.5"')
    a = p.parse_args(argv)
    try:
        rates = [float(x) for x in a.rates.split()]
    except ValueError:
        print(f"--rates {a.rates!r}: expected numbers separated by spaces", file=sys.stderr)
        return 2
    if not all(math.isfinite(r) and r > 0 for r in rates):
        print(f"--rates {a.rates!r}: expected positive rates (requests per second)",
              file=sys.stderr)
        return 2
    try:
        rate, said = sustained(a.run_dir, a.model)
    except ValueError as e:
        print(f"sustained: {e}", file=sys.stderr)
        return 2
    wrong = check_rates(rate, rates) if rates else ""
    if rates and not wrong:
        said += "; " + ", ".join(f"poisson {r:g}/s is {'below' if r < rate else 'above'}"
                                 for r in rates)
    print(said)
    if wrong:
        print(f"sustained: {a.run_dir}: {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
