"""A fleet of real devices for tests and bench: each an sshd in its own network namespace and veth link."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgedeploy.localdevice import LoopbackSshd, NetnsLink
from edgedeploy_agent.bundle import Manifest, describe_artifact, extract_bundle, write_bundle
from tests.helpers import BIN, Cli, agent
from tests.integration.conftest import AGENT


@dataclass
class NetDevice:
    name: str
    link: NetnsLink
    sshd: LoopbackSshd
    root: Path

    def current(self) -> str | None:
        link = self.root / "models" / "default" / "current"
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None


class NetFleet:
    def __init__(self, cli: Cli, base: Path, inventory: Path) -> None:
        self.cli, self.base, self.inventory = cli, base, inventory
        self.devices: dict[str, NetDevice] = {}
        self.cli_bin = BIN / "edgedeploy"

    def args(self) -> list[str]:
        return ["--inventory", str(self.inventory)]

    def add(self, name: str, index: int, tag: str, root: Path | None = None, enroll: bool = True) -> NetDevice:
        link = NetnsLink(index, tag=tag).up()
        try:
            sshd = LoopbackSshd(self.base / name / "sshd", host=link.device_ip, netns=link.ns).start()
        except BaseException:
            link.down_all()  # not in self.devices yet: close() would leave it behind
            raise
        dev = NetDevice(name, link, sshd, root or self.base / name / "root")
        self.devices[name] = dev
        r = self.cli(
            "devices", "add", name, "--host", link.device_ip, "--port", str(sshd.port), "--user", sshd.user,
            "--key-file", str(sshd.client_key), "--profile", "cpu-x86_64", "--root", str(dev.root),
            "--service", "process", "--agent-command", AGENT, "--tags", "lab", *self.args(),
        )  # fmt: skip
        assert r.code == 0, r.err
        if enroll:
            r = self.cli("devices", "enroll", name, "--yes", *self.args())
            assert r.code == 0, r.err
        return dev

    def close(self) -> None:
        for d in self.devices.values():
            try:
                agent("--root", str(d.root), "--json", "stop")
            finally:  # a failing stop must not leave the device's sshd and namespace to the next run
                d.sshd.kill()
                d.link.down_all()

    def rollout(self, *args: str, timeout: float = 300) -> tuple[int, dict]:
        r = self.cli("rollout", *args, "--json", *self.args(), timeout=timeout)
        try:
            return r.code, json.loads(r.out)
        except ValueError:
            raise AssertionError(f"rollout gave no JSON (exit {r.code}): {r.err}") from None


@contextmanager
def net_fleet(cli: Cli, base: Path, names: list[str], first_index: int) -> Iterator[NetFleet]:
    fleet = NetFleet(cli, base, base / "fleet" / "devices.toml")
    tag = f"t{os.getpid() % 10000}"
    try:
        for i, name in enumerate(names):
            fleet.add(name, first_index + i, tag)
        yield fleet
    finally:
        fleet.close()


def padded_bundle(src: Path, out: Path, pad_bytes: int, version: str) -> Path:
    """The same model plus one large random artifact: a bundle big enough to cut mid-upload."""
    work = out.parent / f".pad-{version}"
    manifest = extract_bundle(src, work)
    pad = work / "pad.bin"
    pad.write_bytes(os.urandom(pad_bytes))
    data = manifest.model_dump()
    data["model"]["version"] = version
    data["artifacts"] = sorted(
        [*data["artifacts"], describe_artifact(pad, "other").model_dump()], key=lambda a: a["path"]
    )
    m = Manifest.model_validate(data)
    return write_bundle(out, m, {a.path: work / a.path for a in m.artifacts})
