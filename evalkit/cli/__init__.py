"""`evalkit` command line: one module per subcommand, each with add_parser(subparsers) and run(args)."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable

# name -> module whose `add_parser(subparsers)` adds the command and sets `func`
COMMANDS = {
    "tasks": "evalkit.cli.tasks",
    "validate": "evalkit.cli.validate",
    "generate": "evalkit.cli.generate",
    "models": "evalkit.cli.models",
    "state": "evalkit.cli.state",
    "heads": "evalkit.cli.heads",
    "cost": "evalkit.cli.cost",
    "run": "evalkit.cli.run",
    "publish": "evalkit.cli.publish",
    "compare": "evalkit.cli.compare",
    "train-tiny": "evalkit.cli.train",
    "train-mqar": "evalkit.cli.train_mqar",
    "linearize": "evalkit.cli.linearize",
    "lm-eval-export": "evalkit.cli.lm_eval_export",
}


def csv_list(cast):
    """argparse type: a comma-separated list of `cast` values ("256,512" -> [256, 512])."""
    def parse(text: str):
        try:
            return [cast(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of "
                                             f"{cast.__name__}, got {text!r}") from None
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalkit", description="Measure what a fixed-state recurrent language model forgets.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="lm-eval both ways:\n"
               "  evalkit run --models M --lm-eval-tasks niah_single_1 --lengths 1024 ...\n"
               "      lm-eval's tasks on evalkit models, published with `evalkit publish`\n"
               "  evalkit lm-eval-export --tasks needle --tokenizer M --out DIR\n"
               "  evalkit-lm-eval run --model evalkit --model_args name=M --include_path DIR "
               "--tasks evalkit_needle\n"
               "      evalkit's tasks in lm-eval: evalkit-lm-eval is lm-eval's own command line "
               "with evalkit's\n      models registered (--model evalkit --model_args name=M)")
    from evalkit import __version__

    parser.add_argument("--version", action="version", version=f"evalkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return guarded(f"evalkit {args.command}", lambda: args.func(args))


def guarded(prog: str, command: Callable[[], int | None]) -> int:
    """Run a command; bad input is one line and exit 2, a failed environment one line and
    exit 1. Bugs (other exceptions) keep their traceback."""
    try:
        return int(command() or 0)
    except (ValueError, FileNotFoundError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:  # the environment failed mid-command (disk full, I/O error)
        where = f"{e.filename}: " if e.filename else ""
        print(f"{prog}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
