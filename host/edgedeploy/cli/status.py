"""`edgedeploy status`: pull new reports and show them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .. import api
from ..inventory import Inventory
from . import render
from .options import InventoryOpt, JsonOpt

STAGES = ("capture", "preprocess", "infer", "postprocess")


def show_report(device: str, r: dict[str, Any]) -> None:
    lat = r["latency_ms"]
    rows = [
        [s, f"{lat[s]['p50']:.3f}", f"{lat[s]['p95']:.3f}", f"{lat[s]['p99']:.3f}", f"{lat[s]['mean']:.3f}"]
        for s in STAGES
        if s in lat
    ]
    power = r["power"]
    pw = (
        f"{power.get('mean_watts')} W, {power.get('energy_per_inference_mj')} mJ/inference"
        if power["status"] == "measured"
        else f"unavailable ({power.get('reason')})"
    )
    render.table(
        f"{device} report #{r['seq']}: {r['model']} {r['model_version']} ({r['bundle_id']}), {r['frames']} frames, "
        f"{r['fps']:.1f} FPS (busy time), runtime {r['runtime']}\n  source {r['source']}; power {pw}",
        ["stage (ms)", "p50", "p95", "p99", "mean"],
        rows,
    )


def register(app: typer.Typer) -> None:
    @app.command()
    def status(
        device: Annotated[str, typer.Argument(help="device name")],
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Pull what the device reported since last time and show the latest state."""
        st = api.status(Inventory.load(inventory), device)
        f = st.facts
        if json_:
            render.print_json(
                {"device": device, "facts": f.__dict__, "new_reports": st.new_reports, "reports_total": len(st.reports)}
            )
            return
        render.out.print(
            f"{device}: agent {f.agent_version} ({f.arch}, Python {f.python}); "
            f"current bundle {f.current_release or 'none'}; agent {f.health_state or 'not started'}"
            f"{' (process running)' if f.running else ''}; "
            f"{len(st.new_reports)} new report(s), {len(st.reports)} stored"
        )
        if st.reports:
            show_report(device, st.reports[-1])
