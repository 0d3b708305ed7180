"""`evalkit validate PATH...`: check task YAML files, generating one trial probe each."""
from __future__ import annotations

from pathlib import Path

from evalkit.taskspec import SpecError, generate_probes, grid, load_spec


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="check task YAML files (and generate one probe each)")
    p.add_argument("paths", nargs="+", help="task YAML files or folders of them")
    p.add_argument("--tokenizer", help="tokenizer folder for the trial generation "
                                       "(default: the shipped tiny tokenizer)")
    p.set_defaults(func=run)


def run(args) -> int:
    from evalkit.model_adapters.reference import DEFAULT_TOKENIZER
    from evalkit.tokenization import load_tokenizer

    tok = load_tokenizer(args.tokenizer or DEFAULT_TOKENIZER)
    files: list[Path] = []
    for p in map(Path, args.paths):
        if p.is_dir():
            files.extend(sorted(p.glob("*.yaml")))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    failed = 0
    for f in files:
        try:
            spec = load_spec(f)
            point = grid(spec)[0]
            probe = next(generate_probes(spec, tok, [point]))
        except (SpecError, ValueError, TypeError) as e:
            failed += 1
            print(f"INVALID {f}\n  " + str(e).replace("\n", "\n  "))
            continue
        print(f"ok      {f}: task {spec.name!r} v{spec.version}; trial probe "
              f"{probe.meta.actual_length} tokens (target {point.length})")
    return 1 if failed else 0
