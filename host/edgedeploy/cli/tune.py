"""`edgedeploy tune`: MetaSchedule tuning of what a bundle was built from, measured where the device is."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ..errors import InputError
from . import render
from .options import JsonOpt, SourceOpt, cuda_config_from_env, in_range


def register(app: typer.Typer) -> None:
    @app.command()
    def tune(
        bundle: Annotated[Path | None, typer.Argument(help="a TVM bundle from `edgedeploy build`")] = None,
        trials: Annotated[
            int, typer.Option(help="measured candidates in all (MetaSchedule spreads them)", callback=in_range(1))
        ] = 200,
        tracker: Annotated[
            str | None, typer.Option(help="HOST:PORT of a TVM RPC tracker; devices registered there measure")
        ] = None,
        key: Annotated[str | None, typer.Option(help="with --tracker: the key the device's RPC server uses")] = None,
        export: Annotated[
            Path | None,
            typer.Option(help="write the tuning module to this folder for tune_offline (no measuring here)"),
        ] = None,
        import_: Annotated[
            Path | None, typer.Option("--import", help="store the database tune_offline wrote in this folder")
        ] = None,
        database: Annotated[
            Path | None, typer.Option(help="database folder (default: yours, for the bundle's profile and model)")
        ] = None,
        cost_model: Annotated[str, typer.Option(help="xgb | random")] = "xgb",
        tasks: Annotated[
            int,
            typer.Option(
                help="only N kernels (measured here: the costliest; else most FLOPs x calls); 0: all",
                callback=in_range(0),
            ),
        ] = 0,
        source: SourceOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Tune a bundle's kernels; later builds of the same model, profile and precision apply the database.

        Measured here (CPU profiles on a machine like the device), on a device through TVM's RPC tracker
        (--tracker, --key), or elsewhere: --export DIR, then `python -m edgedeploy.compile.tune_offline DIR`
        where TVM and the GPU are, then --import DIR.
        """
        from .. import api

        if import_ is not None:
            if bundle is not None or tracker or export:
                raise InputError("--import takes only the folder (and --database)")
            dest, records = api.import_tuning(import_, database)
            _report(json_, {"database": str(dest), "records": records}, f"stored {records} records in {dest}")
            return
        if bundle is None:
            raise InputError("name a bundle to tune, or --import DIR")
        manifest = api.inspect_bundle(bundle)
        request = api.tune_request(bundle, manifest, trials, tracker, key, export, database, cost_model, tasks)
        t = time.perf_counter()
        with render.steps(f"tune {bundle.name} for {manifest.profile} ({request.runner})") as step:
            result = api.tune(bundle, request, step, source or (), cuda_config_from_env())
        secs = round(time.perf_counter() - t, 1)
        done, total = len(result.tuned_kernels), result.kernel_count
        if result.exported is not None:
            msg = (
                f"wrote the tuning module to {result.exported} in {secs} s; next: "
                f"python -m edgedeploy.compile.tune_offline {result.exported} --trials {trials}, "
                f"then edgedeploy tune --import {result.exported}"
            )
        else:
            msg = f"{done} of {total} kernels now scheduled from {result.database} ({secs} s)"
        _report(
            json_,
            {
                "database": str(result.database),
                "key": result.key,
                "exported": str(result.exported) if result.exported else None,
                "kernels_from_database": done,
                "kernels": total,
                "seconds": secs,
            },
            msg,
        )


def _report(json_: bool, data: dict[str, object], message: str) -> None:
    if json_:
        render.print_json(data)
    else:
        render.out.print(message)
