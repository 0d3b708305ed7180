"""`evalkit linearize PARENT --recipe configs/linearize.yaml --out DIR [--only NAME ...]`: build
a recipe's linearized twins of a Llama-family parent (attention transfer, every parent weight
frozen, then, when the recipe has `end_to_end`, KL to the parent with LoRA on q/k/v/o),
resumably: a member already built by the same recipe from the same parent is skipped, and a
killed run resumes at its last save. PARENT: smollm2-135m, hf:PATH or a Llama folder. See
evalkit/training/linearize_family.py and linearize_e2e.py.
"""
from __future__ import annotations

from pathlib import Path

from evalkit.yamlfile import read_typed


def add_parser(sub) -> None:
    p = sub.add_parser("linearize", help="build linearized twins of a parent (attention "
                                         "transfer, then end to end; resumable, CPU)")
    p.add_argument("parent", metavar="PARENT", help="smollm2-135m, hf:PATH or a Llama folder")
    p.add_argument("--recipe", default="configs/linearize.yaml")
    p.add_argument("--out", default="model_adapters/twins",
                   help="folder for the twin folders (other files there are kept)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="build only this twin (repeatable)")
    p.set_defaults(func=run)


def load_recipe(path: str):
    from evalkit.training.linearize import Recipe

    return read_typed(path, Recipe, "linearize recipe")


def run(args) -> int:
    from evalkit.training.linearize_family import linearize_family

    recipe = load_recipe(args.recipe)
    status = linearize_family(recipe, args.parent, Path(args.out), args.only,
                              recipe_path=args.recipe)
    print(", ".join(f"{k}: {v}" for k, v in status.items()))
    return 0
