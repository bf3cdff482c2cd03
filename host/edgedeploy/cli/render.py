"""The only module that draws: tables, progress, errors. Plain lines when not on a terminal."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from ..errors import error_code
from ..remote.fleet import FleetResult

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    """A dataclass inside what is printed (a device's facts per model) as its fields; anything else as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def error(message: str, hint: str | None = None) -> None:
    # escaped: a message may quote user text or name a TOML table like [devices.NAME]
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}", markup=True)


def info(message: str) -> None:
    err.print(message, markup=False)


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    # the title is data too (a bundle's path, a sensor's reason such as "extra edgedeploy[agent-nvidia]")
    t = Table(title=None if title is None else escape(title), show_lines=False, title_justify="left")
    for c in columns:
        t.add_column(c)
    for r in rows:  # cells are data (a device's status may say "[/]"), never markup
        t.add_row(*[("-" if v is None else escape(str(v))) for v in r])
    out.print(t)


@contextmanager
def steps(prefix: str) -> Iterator[Callable[[str], None]]:
    """Progress as named steps: a status line on a terminal, plain lines otherwise."""
    if err.is_terminal:
        with err.status(prefix) as status:
            yield lambda s: status.update(f"{prefix}: {s}")
    else:
        yield lambda s: err.print(f"{prefix}: {s}", markup=False)


@contextmanager
def transfer(label: str) -> Iterator[Callable[[int, int], None]]:
    """Upload progress bar on a terminal; a line per 25% otherwise."""
    if err.is_terminal:
        with Progress(
            TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err, transient=True
        ) as p:
            task = p.add_task(label, total=None)
            yield lambda done, total: p.update(task, completed=done, total=total)
    else:
        marks: set[int] = set()

        def plain(done: int, total: int) -> None:
            q = 100 * done // max(total, 1) // 25 * 25
            if q not in marks:
                marks.add(q)
                err.print(f"{label}: {q}% of {total / 1e6:.1f} MB", markup=False)

        yield plain


def engine_summary(runtime: dict[str, Any]) -> str:
    """One line on the device's TensorRT engine (built or cached, build time, acceptance) or its fallback."""
    if runtime.get("fallback_from"):
        reason = (runtime.get("fallback_reason") or {}).get("message", "?")
        return f"TensorRT engine not used, fell back to {runtime.get('runtime')}: {reason}"
    if runtime.get("runtime") != "tensorrt":
        return ""
    acc = runtime.get("acceptance") or {}
    how = f"built in {runtime['build_s']:.1f} s" if runtime.get("engine") == "built" else "reused from the cache"
    return (
        f"TensorRT {runtime.get('tensorrt')} engine {str(runtime.get('engine_key', ''))[:12]} {how}; acceptance "
        f"top-1 agreement {acc.get('top1_agreement')} on {acc.get('samples')} samples, max |err| "
        f"{acc.get('max_abs_error')}"
    )


@contextmanager
def fleet(title: str, devices: list[str]) -> Iterator[Callable[[str, str, str], None]]:
    """Per-device live status: a table redrawn in place on a terminal, one plain line per change otherwise."""
    if not err.is_terminal:
        yield lambda d, s, m: err.print(f"{d}: {s}: {m}", markup=False)
        return
    from rich.live import Live

    rows = dict.fromkeys(devices, ("pending", ""))

    def draw() -> Table:
        t = Table(title=title, title_justify="left")
        for c in ("device", "status", "detail"):
            t.add_column(c)
        for d, (s, m) in rows.items():
            colour = {"committed": "green", "unchanged": "green", "failed": "red", "running": "yellow"}.get(s, "dim")
            t.add_row(escape(d), f"[{colour}]{escape(s)}[/]", escape(m))
        return t

    with Live(draw(), console=err, refresh_per_second=8, transient=False) as live:

        def update(d: str, s: str, m: str) -> None:
            rows[d] = (s, m)
            live.update(draw())

        yield update


def fleet_result(fleet: FleetResult[Any], as_json: bool, describe: Callable[[Any], str]) -> None:
    """Per-device lines (or JSON) for a fleet command: every device, succeeded or failed, with the reason."""
    failed = {n: {"code": error_code(e), "error": e.message} for n, e in fleet.failed.items()}
    if as_json:
        print_json({"succeeded": fleet.succeeded, "failed": failed})
        return
    for name in sorted({*fleet.succeeded, *fleet.failed}):
        if name in fleet.succeeded:
            out.print(f"{name}: {describe(fleet.succeeded[name])}", markup=False)
        else:
            out.print(f"{name}: FAILED [{failed[name]['code']}] {failed[name]['error']}", markup=False)
