"""The lm-eval command with evalkit's models registered: `python -m evalkit.lm_eval.cli ...`.

    python -m evalkit.lm_eval.cli run --model evalkit --model_args name=smollm2-135m,dtype=fp32 \\
        --tasks niah_single_1 --metadata '{"max_seq_lengths": [1024], "tokenizer": "<folder>"}'
    evalkit-lm-eval run ...            # the same, as a console script

Every argument goes to lm-eval's own command line unchanged; the differences from `lm-eval`:
"evalkit" is a known --model (lm-eval 0.4.13 reads no plugin entry points, so the bridge module
has to be imported before it resolves --model), and the evaluated model's tokenizer folder is
put in the task metadata unless --model_args / --metadata name a tokenizer (see
`run.supply_tokenizer`), so RULER-style tasks need only `--model_args name=...`.

To make the plain `lm-eval` / `lm_eval` command know "evalkit" as well:
    python -m evalkit.lm_eval.cli --install-hook     # writes evalkit-lm-eval.pth to site-packages
    python -m evalkit.lm_eval.cli --uninstall-hook
The .pth runs evalkit/lm_eval/hook.py at interpreter start (an import finder only; see there).
"""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

PTH_NAME = "evalkit-lm-eval.pth"


def hook_file() -> Path:
    return Path(__file__).resolve().parent / "hook.py"


def pth_line(hook: Path | None = None) -> str:
    """One .pth line (site.py exec()s lines that start with "import") loading the hook file
    by path, so interpreter start never imports the evalkit package itself."""
    p = str(hook or hook_file())
    # site.py exec()s the line inside a function: a lambda cannot see names bound on the line,
    # so the module is passed in as an argument.
    return ("import os, importlib.util as _u; _p = " + repr(p) + "; "
            "(lambda u, s: s.loader.exec_module(u.module_from_spec(s)))"
            "(_u, _u.spec_from_file_location('_evalkit_lm_eval_hook', _p)) "
            "if os.path.isfile(_p) else None\n")


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def install_hook(site_dir: Path | None = None) -> Path:
    target = (site_dir or site_packages()) / PTH_NAME
    target.write_text("# evalkit: registers --model evalkit with lm-eval "
                      "(remove with python -m evalkit.lm_eval.cli --uninstall-hook)\n" + pth_line())
    return target


def uninstall_hook(site_dir: Path | None = None) -> Path | None:
    target = (site_dir or site_packages()) / PTH_NAME
    if target.exists():
        target.unlink()
        return target
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--install-hook"]:
        print(f"wrote {install_hook()}: `lm-eval run --model evalkit ...` now works in "
              f"{sys.prefix}")
        return 0
    if argv[:1] == ["--uninstall-hook"]:
        removed = uninstall_hook()
        print(f"removed {removed}" if removed else f"no {PTH_NAME} in {site_packages()}")
        return 0
    import evalkit.lm_eval.bridge  # noqa: F401  -- registers "evalkit"
    from evalkit.lm_eval.quiet import quiet_git
    from evalkit.lm_eval.run import supply_tokenizer
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    from evalkit.cli import guarded

    # lm-eval's cli_evaluate, with supply_tokenizer between parsing and running
    sys.argv = ["lm-eval", *argv]
    setup_logging()
    parser = HarnessCLI()
    args = parser.parse_args()

    def command() -> None:
        supply_tokenizer(args)
        with quiet_git():  # lm-eval's `git describe` outside a checkout: no "fatal:" line
            parser.execute(args)

    # an unknown model or task, a bad model option: one line and exit 2, as from `evalkit run`
    return guarded("evalkit-lm-eval", command)


if __name__ == "__main__":
    sys.exit(main())
