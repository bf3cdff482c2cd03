"""What every tuning search shares: trials by measured share of the time, and random kernel inputs."""

from __future__ import annotations

from typing import Any


def allocate_trials(costs: dict[str, float], total: int, step: int = 8, min_share: float = 0.02) -> dict[str, int]:
    """Trials per kernel in proportion to its measured time; kernels under `min_share` of the total get none.

    Counts are multiples of `step` (one search round), at least one round each, most expensive first.
    """
    whole = sum(costs.values())
    if whole <= 0 or total <= 0:
        return {}
    ranked = sorted(((v, k) for k, v in costs.items() if v >= min_share * whole), reverse=True)
    chosen = sum(v for v, _ in ranked)
    plan: dict[str, int] = {}
    left = total
    for v, k in ranked:
        n = max(step, int(round(total * v / chosen / step)) * step)
        if left < step:
            break
        plan[k] = min(n, left - left % step)
        left -= plan[k]
    return plan


def random_input(rng: Any, t: Any) -> Any:
    """Random inputs for a buffer or tensor type: full range for 8-bit integers, moderate otherwise."""
    import numpy as np

    shape = [int(d) for d in (t.shape.values if hasattr(t.shape, "values") else t.shape)]
    dtype = np.dtype(str(t.dtype))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = (int(info.min), int(info.max)) if dtype.itemsize == 1 else (-1000, 1000)
        return rng.integers(lo, hi + 1, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
