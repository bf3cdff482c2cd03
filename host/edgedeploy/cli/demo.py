"""`edgedeploy demo`: build -> ship to a local device over real SSH -> run on video -> report."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from ..inventory import Device, Inventory
from . import render
from .status import show_report


def agent_command() -> str:
    sibling = Path(sys.executable).parent / "edgedeploy-agent"
    return str(sibling) if sibling.exists() else (shutil.which("edgedeploy-agent") or "edgedeploy-agent")


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        workdir: Annotated[Path | None, typer.Option(help="keep everything here (default: a temp folder)")] = None,
        transport: Annotated[str, typer.Option(help="auto | ssh | local")] = "auto",
        data: Annotated[
            Path,
            typer.Option(envvar="EDGEDEPLOY_DATA", help="the shared data folder: the demo trains on its mnist/"),
        ] = Path("../shared/data"),
    ) -> None:
        """Train a small model, build it, push it to a local device, run it on video and report."""
        from .. import api
        from ..demo import MODEL_DESCRIPTION, accuracy, train_digits_model
        from ..localdevice import LoopbackSshd, sshd_available

        work = workdir or Path(tempfile.mkdtemp(prefix="edgedeploy-demo-"))
        use_ssh = transport == "ssh" or (transport == "auto" and sshd_available())
        timings: dict[str, float] = {}
        sshd: LoopbackSshd | None = None
        inv: Inventory | None = None

        def step(n: int, text: str) -> float:
            render.out.print(f"[bold][{n}/6][/] {text}")
            return time.perf_counter()

        try:
            t = step(1, f"train the demo model: {MODEL_DESCRIPTION}")
            d = train_digits_model(work / "model", data)
            timings["train"] = time.perf_counter() - t
            render.out.print(
                f"      {len(d.labels)} held-out digits -> {d.video.name}; accuracy on them before compiling "
                f"{d.test_accuracy:.2%}, on the training digits {d.train_accuracy:.2%} ({timings['train']:.1f} s)"
            )

            t = step(2, "compile it with TVM for profile cpu-x86_64 and write a bundle")
            bundle = work / "digits-mlp.cpu-x86_64.edb"
            with render.steps("      build") as s:
                built = api.build(d.model, "cpu-x86_64", bundle, d.card, progress=s)
            timings["build"] = time.perf_counter() - t
            render.out.print(
                f"      {bundle.name}: {bundle.stat().st_size / 1e3:.0f} kB, id {built.manifest.bundle_id}"
                f"{' (cached)' if built.cached else ''} ({timings['build']:.1f} s)"
            )

            t = step(
                3,
                "start a local device "
                + ("(OpenSSH server on 127.0.0.1)" if use_ssh else "(local transport: sshd is not installed)"),
            )
            inv = Inventory(work / "devices.toml", {})
            common = {
                "name": "demo-01",
                "profile": "cpu-x86_64",
                "root": str(work / "device"),
                "service": "process",
                "agent_command": agent_command(),
                "source": f"file:{d.video}",
            }
            if use_ssh:
                sshd = LoopbackSshd(work / "sshd").start()
                dev = Device(host=sshd.host, port=sshd.port, user=sshd.user, key_file=str(sshd.client_key), **common)  # type: ignore[arg-type]
            else:
                dev = Device(host="localhost", transport="local", **common)  # type: ignore[arg-type]
            inv.add(dev)
            info = api.enroll(inv, "demo-01")
            timings["device"] = time.perf_counter() - t
            render.out.print(
                f"      demo-01 at {dev.address if use_ssh else 'localhost'}: host key "
                f"{info['fingerprint'] or '(local)'} pinned; agent {info['agent_version']}, "
                f"Python {info['python']} ({timings['device']:.1f} s)"
            )

            t = step(4, "push: upload, verify, activate atomically, restart the agent, health-check")
            with render.transfer("      upload") as progress:
                pushed = api.push_bundle(inv, "demo-01", bundle, api.PushOptions(force=True, progress=progress))
            timings["push"] = time.perf_counter() - t
            render.out.print(
                f"      {pushed.outcome} {pushed.release}; warm-up inference "
                f"{(pushed.health or {}).get('warmup_ms', float('nan')):.2f} ms ({timings['push']:.1f} s)"
            )

            t = step(5, f"the agent runs the bundle on the video ({len(d.labels)} frames)")
            api.wait_finished(inv, dev.name, timeout=180)
            timings["run"] = time.perf_counter() - t

            t = step(6, "status: pull the agent's reports over SSH" if use_ssh else "status: pull the agent's reports")
            st = api.status(inv, "demo-01", dest=work / "reports")
            timings["status"] = time.perf_counter() - t
            for r in st.new_reports:
                show_report("demo-01", r)
            acc, n = accuracy(st.new_reports, d.labels)
            render.out.print(
                f"[bold]accuracy on the device: {acc:.2%} top-1 over {n} video frames[/] "
                f"(the NumPy model on the same digits before compiling: {d.test_accuracy:.2%})"
            )
            render.out.print("time per step: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        finally:
            if inv is not None and "demo-01" in inv.devices:
                api.stop_agent(inv, "demo-01")
            if sshd is not None:
                sshd.stop()
            if workdir is None:
                shutil.rmtree(work, ignore_errors=True)
