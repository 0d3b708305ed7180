"""`${VAR}` in a suite: a model spec or string option names an environment variable (an unset
one is an error), so a shared config can name checkpoints without editing it; an option that is
one `${VAR}` alone takes a number or boolean as YAML reads it (`concurrency: ${C}`)."""
from __future__ import annotations

import os
import re
from typing import Any

import yaml

from evalkit.runner.errors import SuiteError

VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: Any, where: str, key: str) -> Any:
    if isinstance(value, dict):
        return {k: expand(v, where, f"{key}.{k}") for k, v in value.items()}
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        var = m.group(1)
        if var not in os.environ:
            raise SuiteError(f"{where}: key {key!r}: environment variable {var} is not set "
                             f"(export it, or write the path into the config)")
        return os.environ[var]
    out = VAR.sub(sub, value)
    if key.startswith("models.") and ".options." in key and VAR.fullmatch(value):
        # an option that is one variable takes its value as YAML reads it: `concurrency:
        # ${C}` with C=4 is the number 4, as `concurrency: 4` written out would be
        try:
            read = yaml.safe_load(out)
        except yaml.YAMLError:
            return out
        return read if isinstance(read, (int, float, bool)) else out
    return out


def forced_choice(value: bool | str, where: str, i: int) -> bool:
    if isinstance(value, bool):
        return value
    key = f"models.{i}.forced_choice"
    if not VAR.fullmatch(value):
        raise SuiteError(f"{where}: key {key!r}: {value!r}: expected true, false or one "
                         f"${{VAR}} holding true or false")
    read = expand(value, where, key)
    try:
        parsed = yaml.safe_load(read)
    except yaml.YAMLError:
        parsed = read
    if not isinstance(parsed, bool):
        raise SuiteError(f"{where}: key {key!r}: {value} is {read!r}; expected true or false")
    return parsed
