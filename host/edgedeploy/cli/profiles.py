"""`edgedeploy profiles list|show`."""

from __future__ import annotations

import typer

from ..profiles import all_profiles, get_profile
from . import render
from .options import JsonOpt

app = typer.Typer(help="Device profiles (built-in and your own TOML files).", no_args_is_help=True)


@app.command("list")
def list_(json_: JsonOpt = False) -> None:
    """List the known device profiles."""
    profs = all_profiles()
    if json_:
        render.print_json([p.model_dump(mode="json") for p in profs.values()])
        return
    render.table(
        None,
        ["name", "arch", "device", "description"],
        [
            [p.name, p.arch, p.device + (f" sm_{p.cuda_sm}" if p.cuda_sm else ""), p.description]
            for p in sorted(profs.values(), key=lambda p: p.name)
        ],
    )


@app.command()
def show(name: str, json_: JsonOpt = False) -> None:
    """Show one profile in full."""
    p = get_profile(name)
    if json_:
        render.print_json(p.model_dump(mode="json"))
        return
    render.table(f"{p.name} ({p.source})", ["field", "value"], [[k, v] for k, v in p.model_dump(mode="json").items()])
