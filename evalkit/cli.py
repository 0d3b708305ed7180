"""`evalkit` command line. Each subcommand lives in its own module with add_parser/run."""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> module defining `add_parser(subparsers)` and `run(args) -> int`
COMMANDS = {
    "tasks": "evalkit.probe_cmds",
    "validate": "evalkit.probe_cmds",
    "generate": "evalkit.probe_cmds",
    "models": "evalkit.models_cmd",
    "state": "evalkit.state_cmd",
    "run": "evalkit.run_cmd",
    "publish": "evalkit.publish_cmd",
    "train-tiny": "evalkit.train_cmd",
    "lm-eval-export": "evalkit.lm_eval_tasks",
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
        prog="evalkit", description="Measure what a fixed-state recurrent language model forgets.")
    from evalkit import __version__

    parser.add_argument("--version", action="version", version=f"evalkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    seen = set()
    for name, module in COMMANDS.items():
        if module in seen:
            continue
        seen.add(module)
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func = getattr(args, "func", None) or importlib.import_module(COMMANDS[args.command]).run
    try:
        return int(func(args) or 0)
    except (ValueError, FileNotFoundError, KeyError) as e:
        # Bad input: a clear one-line error, no traceback. Bugs (other exceptions) keep theirs.
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"evalkit {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:  # the environment failed mid-command (disk full, I/O error): exit 1
        where = f"{e.filename}: " if e.filename else ""
        print(f"evalkit {args.command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
