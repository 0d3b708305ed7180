"""The `window_linear` config key (linearized twin layers, window_linear.py) and the `sinks`
key it shares with windowed attention: defaults, checks, parameters and state size. GLAConfig
(config.py) delegates here, so its file keeps the plain GLA / attention rules.

    window_linear:
      layers       the layers that are twin layers (their heads, kv heads and rotary: `attn`'s)
      window       W, tokens of exact softmax attention (counting the current one)
      sinks        S, the first S tokens kept exact beside the window (default 0)
      state        "gla": a gated linear state with feature maps and a normaliser (LoLCATs);
                   "gated_delta": a gated delta-rule state (Gated DeltaNet), see window_linear.py
      feature_map  "hedgehog" | "softmax" (gla only)
      feature_dim  hedgehog's features per half (gla only)
      gate         "key" | "learned" | "none": the state's forget gate
      mix          the window's weight at init (gla), 1 - the look-back weight at init
                   (gated_delta)
"""
from __future__ import annotations

from typing import Any

WINDOW_LINEAR_KEYS = ("layers", "window", "sinks", "state", "feature_map", "feature_dim", "gate",
                      "mix")
WINDOW_LINEAR_FEATURE_MAPS = ("hedgehog", "softmax")
WINDOW_LINEAR_GATES = ("key", "learned", "none")
WINDOW_LINEAR_STATES = ("gla", "gated_delta")
MAX_SINKS = 1024
_GLA_ONLY = ("feature_map", "feature_dim")


def spec(raw: dict | None) -> dict[str, Any]:
    """The twin layers' settings with defaults filled in: a GLA state with LoLCATs' Hedgehog
    map with 64 features (128 after [xW, -xW]), Liger's key gate, window weight 0.5 at init,
    no sinks."""
    w = dict(raw or {})
    w.setdefault("sinks", 0)
    w.setdefault("state", "gla")
    w.setdefault("feature_map", "hedgehog")
    w.setdefault("feature_dim", 64)
    w.setdefault("gate", "key")
    w.setdefault("mix", 0.5)
    return w


def sinks_error(key: str, n: Any, window: Any) -> str | None:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_SINKS:
        return f"{key}.sinks must be an integer in [0, {MAX_SINKS}], got {n!r}"
    if n and window is None:
        return f"{key}.sinks={n} needs a window (sinks are kept beside a window)"
    return None


def errors(raw: dict, has_attn: bool) -> list[str]:
    w, errs = spec(raw), []
    if not has_attn:
        errs.append("window_linear needs an attn mapping (its heads, kv heads, bias and "
                    "rope_theta are attention's; attn.layers may be empty)")
    for key in ("window", "feature_dim"):
        n = w[key]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            errs.append(f"window_linear.{key} must be a positive integer, got {n!r}")
    for key, choices in (("feature_map", WINDOW_LINEAR_FEATURE_MAPS), ("gate", WINDOW_LINEAR_GATES),
                         ("state", WINDOW_LINEAR_STATES)):
        if w[key] not in choices:
            errs.append(f"window_linear.{key} must be one of {', '.join(choices)}, got {w[key]!r}")
    if w["state"] == "gated_delta":
        errs += [f"window_linear.{k} is for state gla only (a gated_delta state reads the heads' "
                 f"own keys)" for k in _GLA_ONLY if k in raw]
    err = sinks_error("window_linear", w["sinks"], w["window"])
    if err:
        errs.append(err)
    m = w["mix"]
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 < m < 1:
        errs.append(f"window_linear.mix (the initial window weight) must be a number in "
                    f"(0, 1), got {m!r}")
    return errs


def features(raw: dict, head_dim: int) -> int:
    """Features per head of a GLA state: 2 x feature_dim (hedgehog), 2 x head dim (softmax:
    [softmax(x), softmax(-x)] of the head itself); a delta-rule state keys on the head itself."""
    w = spec(raw)
    if w["state"] == "gated_delta":
        return head_dim
    return 2 * (w["feature_dim"] if w["feature_map"] == "hedgehog" else head_dim)


def extra_params(raw: dict, hidden: int, heads: int) -> int:
    """Parameters of a twin layer beyond its attention projections."""
    w, d = spec(raw), hidden // heads
    if w["state"] == "gated_delta":
        # q and k maps [H, d, d], write strength from the key [H, d] + [H], look-back [D, H] + [H]
        n = 2 * heads * d * d + heads * d + heads + hidden * heads + heads
    else:
        n = heads                                                            # mix logits
        if w["feature_map"] == "hedgehog":                                   # q and k maps
            n += 2 * heads * d * w["feature_dim"]
    if w["gate"] == "learned":
        n += hidden * heads + heads
    return n


def fixed_state_values(raw: dict, hidden: int, heads: int) -> int:
    """Values of a twin layer's fixed state per sequence: a GLA state [H, F, d + 1] (the last
    column the normaliser), a delta-rule state [H, d, d]."""
    d = hidden // heads
    F = features(raw, d)
    return heads * F * (d if spec(raw)["state"] == "gated_delta" else d + 1)
