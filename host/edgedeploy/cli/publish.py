"""`edgedeploy publish`: push a signed bundle to an OCI registry once; devices pull it by digest."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from . import render
from .options import JsonOpt


def register(app: typer.Typer) -> None:
    @app.command()
    def publish(
        bundle: Annotated[Path, typer.Argument(help="signed bundle file")],
        registry: Annotated[str, typer.Option("--registry", help="HOST:PORT/REPO of the registry (push endpoint)")],
        tag: Annotated[str | None, typer.Option(help="tag to set as well (default: the release name)")] = None,
        user: Annotated[
            str | None,
            typer.Option(help="registry push account; its password is read from EDGEDEPLOY_REGISTRY_PASSWORD"),
        ] = None,
        tls: Annotated[bool, typer.Option("--tls", help="talk HTTPS to the registry")] = False,
        json_: JsonOpt = False,
    ) -> None:
        """Publish once: blobs the registry has are skipped; prints the digest reference rollouts use."""
        from ..publish import publish as publish_bundle

        password = os.environ.get("EDGEDEPLOY_REGISTRY_PASSWORD") if user else None
        result = publish_bundle(bundle, registry, tag=tag, user=user, password=password, tls=tls)
        if json_:
            render.print_json(asdict(result))
            return
        render.info(
            f"{result.release}: sent {len(result.uploaded)} blob(s), {result.uploaded_bytes / 1e6:.2f} MB; "
            f"{len(result.skipped)} already there; tag {result.tag}"
        )
        render.out.print(result.ref)
