"""`evalkit state` for transformers' recurrent and hybrid families: the state's fixed, window and
growing bytes at N tokens from the config's formula and, measured, from a prefill of a random
model of that config (model_adapters.recurrent.measure)."""
from __future__ import annotations

from pathlib import Path

def _parts(sb) -> dict:
    return {"fixed": sb.fixed, "window": sb.window, "growing": sb.growing, "total": sb.total,
            "kind": sb.kind}


def hf_figures(cfg_path: Path, config, context: int, dtype: str, *, measure: bool) -> dict:
    """`evalkit state` of a transformers config read from `cfg_path` (facts.py's figures)."""
    from evalkit.model_adapters.dtypes import dtype_name, parse_dtype
    from evalkit.model_adapters.facts import hf_facts
    from evalkit.model_adapters.recurrent.family import state_family
    from evalkit.model_adapters.recurrent.formula import UnsupportedFamily, roles_at, to_state
    from evalkit.model_adapters.recurrent.measure import measured_roles

    facts = hf_facts(config, source=cfg_path)
    family = facts.family
    try:
        if state_family(config) != "recurrent":
            raise UnsupportedFamily(f"model_type {family!r} holds attention KV only")
    except UnsupportedFamily as e:
        raise ValueError(f"{cfg_path}: {e}; evalkit state splits 'gla' configs and transformers "
                         f"configs whose cache holds recurrent states or conv tails") from None
    dt = parse_dtype(dtype)
    roles = roles_at(config, context, dt)
    formula = to_state(roles)
    kv = facts.softmax_kv_bytes(context, dt)
    out = {"config": str(cfg_path), "family": family, "dtype": dtype_name(dt), "context": context,
           "parameters": facts.parameters(), "formula": _parts(formula), "formula_roles": roles,
           "state_bytes": formula.total,
           "kv_bytes": kv, "ratio": kv / formula.total}
    if measure:
        m_roles = measured_roles(config, context, dt)
        out["measured"] = _parts(to_state(m_roles))
        out["measured_roles"] = m_roles
        out["agree"] = out["measured"] == out["formula"] and m_roles == roles
    return out


def print_hf(f: dict) -> None:
    def row(label: str, p: dict) -> str:
        return (f"{label:<12} {p['total']:,} B ({p['kind']}): fixed {p['fixed']:,} + window "
                f"{p['window']:,} + growing {p['growing']:,}")

    print(f"config       {f['config']}")
    print(f"family       {f['family']} ({f['dtype']}, {f['context']:,} tokens)")
    print(f"parameters   {f['parameters']:,} ({f['parameters'] / 1e9:.3f} B)")
    def roles(r: dict) -> str:
        return ", ".join(f"{k} {v:,}" for k, v in sorted(r.items()))

    print(row("formula", f["formula"]))
    print(f"{'  by role':<12} {roles(f['formula_roles'])}")
    if "measured" in f:
        print(row("measured", f["measured"]) + ("" if f["agree"] else "   DISAGREES"))
        print(f"{'  by role':<12} {roles(f['measured_roles'])}")
    print(f"KV cache     {f['kv_bytes']:,} B for a same-width softmax model at {f['context']:,} "
          f"tokens ({f['kv_bytes'] / 1e9:.3f} GB)")
    print(f"ratio        {f['ratio']:.1f}x")
