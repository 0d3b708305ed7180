"""What evaluating and serving a model costs on this machine, measured: `evalkit cost` and
benchmarks/real_scale.py both measure through `measure_cost` (one way to measure).

For each context length T, in one process, at one dtype and thread count:
- prefill: T random tokens streamed through the model in segments of `segment` tokens (the
  GLA's own streamed prefill; a transformers model's chunked prefill through its KV cache),
  wall time -> tokens/s, and the counted prefill FLOPs per second as a fraction of this
  machine's matmul limit: the best FLOP/s of a 2048x3072 @ 3072x3072 matmul at the same
  dtype and threads, measured before and after the contexts (the better of the two).
  Counted FLOPs are the model's necessary ones, not what a kernel executes: 2 x the weights
  of every linear layer but the output head per token, the head once (only the last
  position's logits are computed), plus per layer the sequence mixer's own work: a GLA
  layer 4 H d_k d_v per token (writing and reading the state), a causal softmax layer
  2 x 2 x heads x head_dim x T(T+1)/2 (scores and values). `prefill_fraction_2n` is the
  rougher 2 x parameters x tokens convention (embeddings and head counted for every token),
  about 10 % higher for a 3B model with a 50K vocabulary.
- peak memory: resident memory added by the prefill, in its own prefill of the same tokens
  (the timed one runs with glibc's allocator as a server runs it: see _mmap_threshold). The
  peak-memory prefills of all contexts run first, then the timed ones: a timed pass leaves a
  heap that inflates the next peak reading. A caller that wants only one of the two figures
  at a context runs only its prefill (`prefill_contexts`, `decode_contexts`). The
  kernel's high-water mark (VmHWM) is reset right before it (/proc/self/clear_refs), and
  glibc returns freed blocks above 64 KiB to the OS during it (mallopt M_MMAP_THRESHOLD, as
  benchmarks/gla_prefill.py does with MALLOC_MMAP_THRESHOLD_), so the figure follows what
  the prefill holds.
- state: bytes of the tensors held after the prefill (fixed / window / growing), beside the
  config's formula (the ones `evalkit state` prints).
- decode: ms per output token after the context, the median of `decode` greedy steps (one
  warm-up step first), and its ratio to the shortest context's. A model whose state does not
  grow decodes every context in rounds, one step each (_decode_rounds), so a drift in the
  machine's speed during the run cannot pass for a cost of the context.

Weights: a checkpoint folder's safetensors when it has them; otherwise random weights built on
the meta device and materialised in the target dtype parameter by parameter (never a full
fp32 copy). Before anything is allocated, every context is checked against the memory
available (MemAvailable and the cgroup limit, or `max_memory`): weights + state or KV cache
at T + an upper estimate of the prefill's activations; a context that does not fit is
refused with what it would need.
"""
from __future__ import annotations

import ctypes
import gc
import math
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from evalkit.model_adapters.cost_model import SEGMENT, CostError, CostModel
from evalkit.model_adapters.dtypes import dtype_name
from evalkit.probe import MAX_LENGTH
from evalkit.model_adapters.state_kind import StateBytes

MAX_CONTEXTS = 16
MAX_DECODE = 4096
MATMUL_SHAPE = (2048, 3072, 3072)  # [M, K] @ [K, N]
MEMORY_HEADROOM = 0.9   # refuse when the estimate exceeds this share of the available memory



# ---------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------
def check_contexts(contexts: Sequence[int], flag: str = "--contexts") -> list[int]:
    ctx = [int(c) for c in contexts]
    if not ctx:
        raise CostError(f"{flag}: give at least one context length")
    if len(ctx) > MAX_CONTEXTS:
        raise CostError(f"{flag}: at most {MAX_CONTEXTS} context lengths, got {len(ctx)}")
    bad = [c for c in ctx if not 1 <= c <= MAX_LENGTH]
    if bad:
        raise CostError(f"{flag}: every context must be between 1 and {MAX_LENGTH:,} tokens, "
                        f"got {', '.join(f'{c:,}' for c in bad)}")
    if len(set(ctx)) != len(ctx):
        raise CostError(f"{flag}: repeated context length(s) "
                        f"{sorted({c for c in ctx if ctx.count(c) > 1})}")
    return sorted(ctx)


def check_decode(n: int, flag: str = "--decode") -> int:
    if not 0 <= int(n) <= MAX_DECODE:
        raise CostError(f"{flag} must be between 0 and {MAX_DECODE:,} decode steps, got {n:,}")
    return int(n)


def check_threads(n: int | None, flag: str = "--threads") -> int:
    cpus = os.cpu_count() or 1
    if n is None:
        return torch.get_num_threads()
    if not 1 <= int(n) <= cpus:
        raise CostError(f"{flag} must be between 1 and {cpus} (this machine's CPUs), got {n}")
    return int(n)


def parse_bytes(text: str, flag: str = "--max-memory") -> int:
    """"8G", "512M", "1.5GiB", "1000000" -> bytes (powers of 1024)."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    s = str(text).strip().lower().removesuffix("ib").removesuffix("b")
    num, unit = (s[:-1], s[-1]) if s and s[-1] in "kmgt" else (s, "")
    try:
        value = float(num) * units[unit]
    except ValueError:
        raise CostError(f"{flag}: expected a size such as 8G or 512M, got {text!r}") from None
    if not math.isfinite(value) or value < 1:
        raise CostError(f"{flag}: expected a positive size, got {text!r}")
    return int(value)


# ---------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------
def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def available_memory() -> tuple[int, str]:
    """(bytes this process may still allocate, where that figure comes from)."""
    best, where = None, "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    best, where = int(line.split()[1]) * 1024, "MemAvailable"
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max" and (best is None or int(limit) - used < best):
            best, where = int(limit) - used, "the cgroup limit"
    except (OSError, ValueError):
        pass
    if best is None:
        raise RuntimeError("cannot read the available memory (/proc/meminfo); pass --max-memory")
    return best, where


M_MMAP_THRESHOLD = -3
SMALL_MMAP = 64 << 10   # the peak pass: blocks above 64 KiB by mmap, returned on free
SERVER_MMAP = 32 << 20  # the timed pass: glibc's own ceiling for its dynamic threshold


def _mmap_threshold(nbytes: int) -> None:
    """glibc: serve blocks above `nbytes` by mmap. Small (SMALL_MMAP), freeing returns memory
    to the OS at once, so the resident peak follows what the prefill holds; but then every
    large temporary page-faults afresh, which cost the 3B prefill 23 % of its speed here
    (87.7 -> 68.9 % of the matmul limit at 1K). Hence two passes: timed at SERVER_MMAP (the
    allocator as a server runs it), peak at SMALL_MMAP."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, nbytes)
    except (OSError, AttributeError):
        pass  # not glibc: peak memory may then read high after earlier contexts


def _reset_peak() -> int:
    """Reset VmHWM to the current RSS, after handing the heap's free pages (what the timed
    pass left cached) back to the OS; returns that RSS in bytes."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    before = _status_kb("VmRSS") * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return before


def gib(n: float) -> str:
    """Bytes in the largest binary unit that keeps the figure >= 1 (KiB .. TiB)."""
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


# ---------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------
def matmul_limit(dtype: torch.dtype, repeats: int = 5, budget_s: float = 3.0) -> float:
    """Best FLOP/s of a [2048, 3072] @ [3072, 3072] matmul at `dtype` (current threads).

    The warm-up (BLAS and thread pools) is a 64-row product of the same K and N; the full
    product is then timed up to `repeats` times, stopping once `budget_s` seconds are spent
    (at least once). Why the budget: on a CPU without native bf16 (AVX2 only) one bf16 product
    takes about 40 s, so warm-up + 5 repeats, twice a run, held one run for 8 minutes."""
    M, K, N = MATMUL_SHAPE
    g = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=g).to(dtype)
    b = torch.randn(K, N, generator=g).to(dtype)
    a[:64] @ b  # warm-up
    best, spent = math.inf, 0.0
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        a @ b
        secs = time.perf_counter() - t0
        best, spent = min(best, secs), spent + secs
        if spent >= budget_s:
            break
    return 2.0 * M * K * N / best


def check_memory(cm: CostModel, contexts: Sequence[int], segment: int,
                 max_memory: int | None) -> dict:
    """Refuse (CostError) a context that would not fit, before anything is allocated."""
    if max_memory is None:
        budget, where = available_memory()
        budget = int(budget * MEMORY_HEADROOM)
        where = f"{MEMORY_HEADROOM:.0%} of {where}"
    else:
        budget, where = int(max_memory), "--max-memory"
    weights = cm.weight_bytes()
    plan = {}
    for T in contexts:
        need = cm.need_bytes(T, segment)
        total = weights + need["state"] + need["activations"]
        plan[T] = total
        if total > budget:
            what = "KV cache" if cm.shape.state_formula(T).growing else "state"
            raise CostError(
                f"context {T:,} would need about {gib(total)} (weights {gib(weights)} + "
                f"{what} {gib(need['state'])} + prefill activations {gib(need['activations'])}) "
                f"but {gib(budget)} is available ({where}); drop it from --contexts"
                f"{'' if max_memory is None else ' or raise --max-memory'}")
    return {"budget_bytes": budget, "budget_source": where, "need_bytes": plan}


def _finite(row: dict) -> dict:
    for k, v in row.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise RuntimeError(f"measured {k} is not finite ({v}); the clock or the counters failed")
    return row


@torch.no_grad()
def measure_cost(cm: CostModel, contexts: Sequence[int], *, decode: int = 32,
                 prefill_contexts: Sequence[int] | None = None,
                 decode_contexts: Sequence[int] | None = None, threads: int | None = None,
                 segment: int = SEGMENT, max_memory: int | None = None, seed: int = 0,
                 progress: bool = True, on_row: Callable[[dict], None] | None = None
                 ) -> dict:
    """Measure `cm` at each context (see the module doc). Returns {"run": {...}, "rows": [...]}
    with one row per context, ascending. Each prefill is run only where its figures are
    asked for: `prefill_contexts` (default: all) get the timed prefill, `decode_contexts`
    (default: all) the peak-memory prefill and the decode steps after it. A figure not
    measured at a context is None in its row; the state is measured in every row."""
    ctx = check_contexts(contexts)
    decode = check_decode(decode)
    timed = set(ctx if prefill_contexts is None else prefill_contexts)
    with_decode = set(ctx if decode_contexts is None else decode_contexts)
    if unused := [T for T in ctx if T not in timed | with_decode]:
        raise CostError(f"contexts {unused} are in neither the prefill nor the decode contexts")
    if stray := sorted((timed | with_decode) - set(ctx)):
        raise CostError(f"prefill or decode contexts {stray} are not among the contexts")
    if not 1 <= segment <= MAX_LENGTH:
        raise CostError(f"segment must be between 1 and {MAX_LENGTH:,}, got {segment}")
    threads = check_threads(threads)
    torch.set_num_threads(threads)
    memory = check_memory(cm, ctx, segment, max_memory)
    _mmap_threshold(SERVER_MMAP)

    from tqdm import tqdm

    total = sum(T for T in ctx if T in timed) + sum(T + decode + 1 for T in ctx if T in with_decode)
    bar = tqdm(total=total, unit="tok", desc=f"{cm.name}: build", dynamic_ncols=True,
               leave=False, disable=not progress)
    try:
        if any(p.is_meta for p in cm.model.parameters()):
            cm.materialise(seed)
        bar.set_description_str(f"{cm.name}: matmul limit")
        limit0 = matmul_limit(cm.dtype)
        g = torch.Generator().manual_seed(seed)
        vocab = cm.shape.vocab
        warm = torch.randint(0, vocab, (1, min(64, ctx[0])), generator=g)
        st, last = cm.prefill(warm, segment, lambda n: None)  # libraries, thread pools
        cm.decode_step(int(last.argmax()), st)
        del st, last
        ids = {T: torch.randint(0, vocab, (1, T), generator=g) for T in ctx}
        rows = {T: _row(cm, threads, T) for T in ctx}
        # A state that does not grow is cheap to keep: every context's is held and they are
        # decoded in rounds (_decode_rounds); a growing KV cache is decoded after its prefill.
        fixed = not any(cm.shape.state_formula(T).growing for T in with_decode)
        held: dict[int, tuple] = {}
        # Peak memory first, every pass under the small mmap threshold: a timed pass before it
        # (blocks up to 32 MiB from glibc's heap) left a fragmented heap that the next pass's
        # small blocks spread over, 90-170 MiB more resident at 8K here after a multi-segment
        # timed pass than after another peak pass, which reads flat
        for T in (T for T in ctx if T in with_decode):
            bar.set_description_str(f"{cm.name}: peak memory {T:,}")
            _mmap_threshold(SMALL_MMAP)
            try:
                before = _reset_peak()
                state, last = cm.prefill(ids[T], segment, bar.update)
                rows[T]["peak_memory_bytes"] = _status_kb("VmHWM") * 1024 - before
            finally:
                _mmap_threshold(SERVER_MMAP)
            _set_state(rows[T], cm, state)
            if decode and fixed:
                held[T] = (state, last)
            elif decode:
                bar.set_description_str(f"{cm.name}: decode after {T:,}")
                _set_decode(rows[T], _decode_rounds(cm, {T: (state, last)}, decode, bar)[T])
            del state, last
            gc.collect()
        for T in (T for T in ctx if T in timed):
            bar.set_description_str(f"{cm.name}: prefill {T:,}")
            gc.collect()
            t0 = time.perf_counter()
            state, last = cm.prefill(ids[T], segment, bar.update)
            secs = time.perf_counter() - t0
            rows[T].update(prefill_seconds=secs, prefill_tokens_per_s=T / secs,
                           prefill_flops_per_s=rows[T]["prefill_flops"] / secs)
            if T not in with_decode:
                _set_state(rows[T], cm, state)
            del state, last
            gc.collect()
        if held:
            bar.set_description_str(f"{cm.name}: decode after {', '.join(f'{T:,}' for T in held)}")
            for T, times in _decode_rounds(cm, held, decode, bar).items():
                _set_decode(rows[T], times)
            held.clear()
        del ids
        rows = [rows[T] for T in ctx]
        bar.set_description_str(f"{cm.name}: matmul limit")
        limit1 = matmul_limit(cm.dtype)
    finally:
        bar.close()
    limit = max(limit0, limit1)
    params = cm.parameters()
    base = next((r["decode_ms_per_token"] for r in rows if r["decode_ms_per_token"]), None)
    for r in rows:
        r["matmul_limit_flops_per_s"] = limit
        if r["prefill_seconds"] is not None:
            r["prefill_fraction_of_matmul_limit"] = r["prefill_flops_per_s"] / limit
            # the rougher convention 2 x parameters x tokens (embeddings and head included)
            r["prefill_fraction_2n"] = 2.0 * params * r["context"] / r["prefill_seconds"] / limit
        if r["decode_ms_per_token"] is not None and base:
            r["decode_ratio"] = r["decode_ms_per_token"] / base
        _finite(r)
        if on_row:
            on_row(r)
    run = {"model": cm.name, "kind": cm.kind, "dtype": dtype_name(cm.dtype), "threads": threads,
           "parameters": cm.parameters(), "weights": str(cm.weights) if cm.weights else "random",
           "build_seconds": cm.build_seconds, "segment": segment,
           "matmul_limit_flops_per_s": limit, "matmul_limit_before_after": [limit0, limit1],
           "memory_budget_bytes": memory["budget_bytes"],
           "memory_budget_source": memory["budget_source"],
           "load_average": list(os.getloadavg())}
    return {"run": _finite(run), "rows": rows}


def _row(cm: CostModel, threads: int, T: int) -> dict:
    """A context's row before it is measured (None: not measured at this context)."""
    return {"model": cm.name, "dtype": dtype_name(cm.dtype), "threads": threads, "context": T,
            "prefill_seconds": None, "prefill_tokens_per_s": None,
            "prefill_flops": cm.prefill_flops(T), "prefill_flops_per_s": None,
            "prefill_fraction_of_matmul_limit": None, "prefill_fraction_2n": None,
            "decode_steps": 0, "decode_ms_per_token": None, "decode_ratio": None,
            "peak_memory_bytes": None}


def _set_state(row: dict, cm: CostModel, state) -> None:
    """The state held after the prefill, measured from its tensors, beside the formula."""
    parts, elements = cm.state_parts(state)
    formula = cm.shape.state_formula(row["context"])
    row.update(state_bytes_measured=parts.total, state_bytes_formula=formula.total,
               state_parts_measured=_parts(parts), state_parts_formula=_parts(formula),
               state_elements=elements,
               state_bytes_at_model_dtype=elements * torch.empty(0, dtype=cm.dtype).element_size())


def _decode_rounds(cm: CostModel, held: dict[int, tuple], decode: int, bar) -> dict[int, list[float]]:
    """Seconds of `decode` greedy steps after each held (state, last logits), one untimed
    warm-up step each first, then one step per context a round: a drift in the machine's speed
    (5 % over the minutes of a 3B run here) falls on every context alike, not on the later
    ones."""
    for T, (state, last) in held.items():
        held[T] = cm.decode_step(int(last.argmax()), state)
        bar.update(1)
    times: dict[int, list[float]] = {T: [] for T in held}
    for _ in range(decode):
        for T, (state, last) in held.items():
            tok = int(last.argmax())
            t0 = time.perf_counter()
            held[T] = cm.decode_step(tok, state)
            times[T].append(time.perf_counter() - t0)
            bar.update(1)
    return times


def _set_decode(row: dict, times: list[float]) -> None:
    row["decode_steps"] = len(times)
    row["decode_ms_per_token"] = 1000.0 * statistics.median(times)


def _parts(p: StateBytes) -> dict:
    return {"fixed": p.fixed, "window": p.window, "growing": p.growing, "kind": p.kind}
