"""`edgedeploy status`: pull new reports and show them, for one device or the whole fleet."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import InputError, fleet_exit_code
from ..inventory import Inventory
from . import render
from .options import InventoryOpt, JsonOpt, ModelFilterOpt

if TYPE_CHECKING:
    from ..remote.status import DeviceStatus

# batch_wait: a source of a multi-source agent (report schema 2)
STAGES = ("capture", "batch_wait", "preprocess", "infer", "postprocess")


def power_text(power: dict[str, Any]) -> str:
    if power["status"] != "measured":
        return f"unavailable ({power.get('reason')})"
    text = f"{power.get('mean_watts')} W, {power.get('energy_per_inference_mj')} mJ/inference"
    if power.get("idle_watts") is not None:
        text += f" (idle {power['idle_watts']} W, {power.get('dynamic_energy_per_inference_mj')} mJ above idle)"
    return text + f" [{power.get('sensor')}, {power.get('energy_source')}]"


def source_text(r: dict[str, Any]) -> str:
    if r.get("camera_up") is None:
        return str(r["source"])
    age = r.get("frame_age_ms") or {}
    return (
        f"{r['source']} ({'up' if r['camera_up'] else 'DOWN'}, {r.get('reconnects', 0)} reconnects, "
        f"{r.get('dropped_frames', 0)} dropped, frame age p50 {age.get('p50', '-')} ms)"
    )


def of_model(reports: list[dict[str, Any]], slot: str) -> list[dict[str, Any]]:
    """The reports of model slot `slot` (a report from before slots is the default model's)."""
    return [r for r in reports if r.get("slot", DEFAULT_SLOT) == slot]


def latest_per_source(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest report of each source the agent serves now: the newest report's own and, for a multi-source
    agent (its `batch` says how many sources it serves), the newest of each of the others before it."""
    if not reports:
        return []
    wanted = (reports[-1].get("batch") or {}).get("sources", 1)
    latest: dict[str, dict[str, Any]] = {}
    for r in reversed(reports):
        latest.setdefault(r["source"], r)
        if len(latest) == wanted:
            break
    return sorted(latest.values(), key=lambda r: r["seq"])


def show_report(device: str, r: dict[str, Any]) -> None:
    lat = r["latency_ms"]
    rows = [[s, *(f"{lat[s][q]:.3f}" for q in ("p50", "p95", "p99", "mean"))] for s in STAGES if s in lat]
    gpu = r.get("model_gpu_ms")  # report schema 3: the model's own GPU time, on sampled frames (the model clock)
    if gpu:
        rows.append(["(model on the GPU)", *(f"{gpu[q]:.3f}" for q in ("p50", "p95", "p99", "mean"))])
    temps = r.get("temperatures_c")
    extra = f"; temperatures {', '.join(f'{k} {v} C' for k, v in temps.items())}" if temps else ""
    slot = r.get("slot", DEFAULT_SLOT)
    of = "" if slot == DEFAULT_SLOT else f" model {slot}"
    batch, fps = r.get("batch"), f"{r['fps']:.1f} FPS (busy time)"
    if batch:
        latency = r.get("frame_latency_ms") or {}
        fps = (
            f"{r['fps']:.1f} FPS of {batch['aggregate_fps']:.1f} for {batch['sources']} sources, batch "
            f"{batch['size']} (mean fill {batch['mean_fill']}), frame latency p50/p99 {latency.get('p50', '-')}/"
            f"{latency.get('p99', '-')} ms"
        )
    render.table(
        f"{device}{of} report #{r['seq']}: {r['model']} {r['model_version']} ({r['bundle_id']}), {r['frames']} frames, "
        f"{fps}, runtime {r['runtime']}\n  source {source_text(r)}\n"
        f"  power {power_text(r['power'])}{extra}",
        ["stage (ms)", "p50", "p95", "p99", "mean"],
        rows,
    )


def models_of(st: DeviceStatus) -> list[str]:
    """The device's model slots, `default` first as the agent lists them (one before slots: `default`)."""
    return list(st.facts.models) or [DEFAULT_SLOT]


def fleet_rows(name: str, st: DeviceStatus, model: str | None = None) -> list[list[Any]]:
    """One row per model on the device (`NAME` for its default model, `NAME/SLOT` for the others; a device with
    one model is one row, as before slots), or only `model`'s row: each with that model's own state, release and
    reports."""
    f, slots = st.facts, models_of(st)
    if model is not None:
        if model not in slots:
            return [[name, "NO MODEL", f"no model {model!r} (models: {', '.join(slots)})", "", "", "", "", "", ""]]
        slots = [model]
    rows = []
    for slot in slots:
        m = f.models.get(slot)
        health, release = (m.health_state, m.current_release) if m else (f.health_state, f.current_release)
        label = name if slot == DEFAULT_SLOT else f"{name}/{slot}"
        rows.append(_row(label, health, release, of_model(st.reports, slot), len(of_model(st.new_reports, slot))))
    return rows


def _row(label: str, health: str | None, release: str | None, reports: list[dict[str, Any]], new: int) -> list[Any]:
    r = reports[-1] if reports else None
    infer = (r or {}).get("latency_ms", {}).get("infer") if r else None
    power = (r or {}).get("power") or {}
    temps = (r or {}).get("temperatures_c") or {}
    camera = "-" if not r or r.get("camera_up") is None else ("up" if r["camera_up"] else "DOWN")
    fps = f"{r['fps']:.1f}" if r else "-"
    if r and r.get("batch"):  # several sources: all of them
        latest = latest_per_source(reports)
        camera = f"{sum(1 for x in latest if x.get('camera_up'))}/{len(latest)} up"
        fps = f"{r['batch']['aggregate_fps']:.1f}"
    return [
        label,
        health or "not started",
        release or "-",
        fps,
        f"{infer['p50']:.2f}/{infer['p99']:.2f}" if infer else "-",
        camera,
        power.get("mean_watts") if power.get("status") == "measured" else "n/a",
        f"{max(temps.values()):.1f}" if temps else "-",
        new,
    ]


def _summary(st: DeviceStatus, model: str | None = None) -> dict[str, Any]:
    """A device's entry in `status --json` of the fleet: every model's newest report, or only `model`'s (with
    `has_model` false and no report when the device has no such model, as the table's NO MODEL row)."""
    reports, new = (
        (st.reports, st.new_reports)
        if model is None
        else (of_model(st.reports, model), of_model(st.new_reports, model))
    )
    latest = {r.get("slot", DEFAULT_SLOT): r for r in reports}  # the newest report of each model
    summary = {
        "facts": st.facts.__dict__,
        "new_reports": len(new),
        "latest": reports[-1] if reports else None,
        "latest_by_model": latest,
    }
    if model is not None:
        summary |= {"model": model, "has_model": model in models_of(st)}
    return summary


def register(app: typer.Typer) -> None:
    @app.command()
    def status(
        device: Annotated[str | None, typer.Argument(help="device name; leave out for the whole fleet")] = None,
        group: Annotated[str | None, typer.Option("--group", help="only devices with this tag")] = None,
        via: Annotated[str, typer.Option(help="ssh: ask each device; mqtt: read the retained statuses")] = "ssh",
        model: ModelFilterOpt = None,
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Pull what devices reported since last time and show the latest state.

        With a DEVICE: its detail (an error exits with its own code: 3 unreachable, 4 refused). Without (or
        with --group TAG): one line per device, pulled in parallel; exit 0 when all answered, 5 when some did
        (partial), 1 when none did. With --via mqtt a device counts as answered when its retained status is
        there and not offline, refused, rolled-back or unreadable. A device with several models lists each (the
        fleet table: a row per model, NAME/MODEL); --model NAME shows only that model's state and latest report
        (`default` unless named); with --via mqtt, each device's retained status about model NAME (its own
        status topic).
        """
        from .. import api

        inv = Inventory.load(inventory)
        if via == "mqtt":
            _via_mqtt(api.select_devices(inv, [device] if device else None, group), group, json_, model or DEFAULT_SLOT)
            return
        if via != "ssh":
            raise InputError(f"--via must be ssh or mqtt, got {via!r}")
        if device is not None and group is None:
            _one(inv, device, json_, model or DEFAULT_SLOT)
            return
        fleet = api.fleet_status(inv, tag=group)
        if json_:
            render.print_json(
                {
                    "devices": {n: _summary(st, model) for n, st in sorted(fleet.succeeded.items())},
                    "failed": {n: {"error": e.message, "hint": e.hint} for n, e in sorted(fleet.failed.items())},
                }
            )
        else:
            rows = [row for n, st in sorted(fleet.succeeded.items()) for row in fleet_rows(n, st, model)]
            rows += [[n, "UNREACHABLE", e.message, "", "", "", "", "", ""] for n, e in sorted(fleet.failed.items())]
            render.table(
                f"fleet{' ' + group if group else ''}: {len(fleet.succeeded)} ok, {len(fleet.failed)} failed",
                ["device", "agent", "bundle", "FPS", "infer p50/p99 ms", "camera", "W", "max C", "new"],
                rows,
            )
        raise typer.Exit(fleet.exit_code)


def _via_mqtt(names: list[str], group: str | None, json_: bool, model: str) -> None:
    from .. import pull_api
    from ..remote.mqtt import UNREADABLE

    statuses = pull_api.fleet_status_via_mqtt(names, model=model)
    if json_:
        render.print_json({"devices": statuses})
    else:
        rows = [
            [n, st.get("state", "?"), _release(st), st.get("rollout") or "-", st.get("code") or "",
             _progress(st), st.get("updated", "")]
            if st else [n, "NO STATUS", "-", "-", "", "", ""]
            for n, st in statuses.items()
        ]  # fmt: skip
        seen = sum(1 for st in statuses.values() if st)
        render.table(
            f"fleet{' ' + group if group else ''} via mqtt: {seen} of {len(names)} reported",
            ["device", "state", "release", "rollout", "code", "progress", "updated"],
            rows,
        )
    bad = ("offline", "refused", "rolled-back", UNREADABLE)
    ok = sum(1 for st in statuses.values() if st and st.get("state") not in bad)
    raise typer.Exit(fleet_exit_code(ok, len(names)))


def _release(st: dict[str, Any]) -> str:
    """The release a status is about, with its model slot when that is not `default`."""
    model = st.get("model") or DEFAULT_SLOT
    return (st.get("release") or "-") + ("" if model == DEFAULT_SLOT else f" (model {model})")


def _progress(st: dict[str, Any]) -> str:
    p = st.get("progress") or {}
    return f"{p['bytes'] / 1e6:.1f}/{p['total'] / 1e6:.1f} MB" if p.get("total") else ""


def _one(inv: Inventory, device: str, json_: bool, model: str) -> None:
    from .. import api

    st = api.status(inv, device, model=model)
    f = st.facts
    reports = of_model(st.reports, model)
    if json_:
        render.print_json(
            {"device": device, "facts": f.__dict__, "new_reports": st.new_reports, "reports_total": len(st.reports)}
        )
        return
    of = "" if model == DEFAULT_SLOT else f" model {model}"
    render.out.print(
        f"{device}{of}: agent {f.agent_version} ({f.arch}, Python {f.python}); "
        f"current bundle {f.current_release or 'none'}; agent {f.health_state or 'not started'}"
        f"{' (process running)' if f.running else ''}; "
        f"{len(st.new_reports)} new report(s), {len(st.reports)} stored"
    )
    if len(f.models) > 1:
        for slot, m in f.models.items():
            pending = f", interrupted in {m.pending_state}" if m.pending_state else ""
            render.out.print(
                f"  model {slot}: {m.current_release or 'no bundle'}, agent {m.health_state or 'not started'}, "
                f"source {m.source or 'none'}{pending}"
            )
    for r in latest_per_source(reports):
        show_report(device, r)
