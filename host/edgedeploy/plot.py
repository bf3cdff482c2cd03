"""Draw a device's pulled reports: per-stage latency histograms and a power timeline (matplotlib, lazily)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy_agent.report import HIST_EDGES_MS, STAGES

from .errors import InputError


def merged_histograms(reports: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per stage: frame counts per HIST_EDGES_MS bucket, summed over every report that carries them."""
    out = {s: np.zeros(len(HIST_EDGES_MS) + 1, dtype=np.int64) for s in STAGES}
    for r in reports:
        for s, counts in (r.get("latency_hist") or {}).items():
            if s in out and len(counts) == len(out[s]):
                out[s] += np.asarray(counts, dtype=np.int64)
    return out


def power_series(reports: list[dict[str, Any]]) -> tuple[list[dt.datetime], list[float], list[float | None]]:
    """(window end, mean watts, idle watts) for the windows whose power was measured; nothing is filled in."""
    t, w, idle = [], [], []
    for r in reports:
        p = r.get("power") or {}
        if p.get("status") == "measured" and p.get("mean_watts") is not None:
            # naive UTC: numpy's datetime64 has no time zones
            t.append(dt.datetime.fromisoformat(str(r["window_end"]).replace("Z", "+00:00")).replace(tzinfo=None))
            w.append(float(p["mean_watts"]))
            idle.append(p.get("idle_watts"))
    return t, w, idle


def plot_reports(device: str, reports: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Write a PNG; returns what was drawn (frames per stage, power points) for the caller to print."""
    if not reports:
        raise InputError(f"{device}: no reports stored yet", hint=f"run `edgedeploy status {device}` to pull them")
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    hists = merged_histograms(reports)
    t, watts, idle = power_series(reports)
    fig = plt.figure(figsize=(12, 11), constrained_layout=True)
    grid = fig.add_gridspec(3, 2)
    edges = np.asarray(HIST_EDGES_MS)
    for i, stage in enumerate(STAGES):
        ax = fig.add_subplot(grid[i // 2, i % 2])
        counts = hists[stage][1:-1]  # the two overflow buckets have no finite width to draw
        if counts.sum() == 0:
            ax.text(0.5, 0.5, "no histogram in these reports", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.stairs(counts, edges, fill=True, alpha=0.7)
            nz = np.nonzero(counts)[0]
            ax.set_xlim(edges[max(nz[0] - 1, 0)], edges[min(nz[-1] + 2, len(edges) - 1)])
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on a short log axis
        ax.set_title(f"{stage}: {int(hists[stage].sum())} frames")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("frames")
    ax = fig.add_subplot(grid[2, :])
    if t:
        times = np.asarray(t, dtype="datetime64[ms]")
        ax.plot(times, watts, marker="o", label="mean power per window")
        has_idle = np.asarray([i is not None for i in idle])
        if has_idle.any():
            idle_w = [float(i) for i in idle if i is not None]
            ax.plot(times[has_idle], idle_w, linestyle="--", label="idle baseline")
        ax.set_ylabel("W")
        ax.legend()
    else:
        reasons = sorted({str((r.get("power") or {}).get("reason")) for r in reports})
        text = "power unavailable (no number is drawn that no sensor gave):\n" + "\n".join(reasons).replace("; ", "\n")
        ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_title("power timeline")
    ax.set_xlabel("window end (UTC)")
    last = reports[-1]
    fig.suptitle(f"{device}: {last['model']} {last['model_version']} ({last['bundle_id']}), {len(reports)} reports")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return {"out": str(out), "frames": {s: int(h.sum()) for s, h in hists.items()}, "power_points": len(t)}
