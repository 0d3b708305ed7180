"""`evalkit validate PATH...`: check task YAML files, generating a small trial grid of each.

The trial probes go through the same generation and checks as `evalkit run`
(`evalkit.taskspec.generate_probes`): two samples at the task's shortest default length, so
a generator that ignores its seed is caught as well as a faulty probe.
"""
from __future__ import annotations

from pathlib import Path

from evalkit.taskspec import SpecError, generate_probes, grid, load_spec

TRIAL_SAMPLES = 2


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="check task YAML files (and generate trial probes)")
    p.add_argument("paths", nargs="+", help="task YAML files or folders of them")
    p.add_argument("--tokenizer", help="a registered model's name or a tokenizer folder for "
                                       "the trial generation (default: the shipped tiny "
                                       "tokenizer)")
    p.set_defaults(func=run)


def task_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.yaml"))
            if not found:
                raise SpecError(f"{p}: no task files (*.yaml) in this folder")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return files


def run(args) -> int:
    from evalkit.cli.tokenizer_arg import tokenizer_from_arg
    from evalkit.model_adapters.reference import DEFAULT_TOKENIZER

    files = task_files(args.paths)
    tok = tokenizer_from_arg(args.tokenizer or DEFAULT_TOKENIZER)
    failed = 0
    for f in files:
        try:
            spec = load_spec(f)
            d = spec.defaults
            points = grid(spec, lengths=[min(d.lengths)], depths=d.depths[:1], loads=d.loads[:1],
                          samples=TRIAL_SAMPLES)
            probes = list(generate_probes(spec, tok, points))
        except SpecError as e:
            failed += 1
            print(f"INVALID {f}\n  " + str(e).replace("\n", "\n  "))
            continue
        print(f"ok      {f}: task {spec.name!r} v{spec.version}; {len(probes)} trial probes of "
              f"{', '.join(str(p.meta.actual_length) for p in probes)} tokens "
              f"(target {points[0].length})")
    return 1 if failed else 0
