"""Fleet push benchmark: 1 device vs 20 devices, and a re-push of an unchanged bundle.

Every device is a real sshd in its own network namespace (veth link 10.77.N.0/24, N = 101..121) with
a real agent in process mode. Needs root, iproute2, openssh-server and ../shared/data. Targets:
20 devices <= 3x one device; re-push of an unchanged bundle <= 1 s.

    .venv/bin/python bench/fleet.py [--devices 20]

Prints the push time to 1 device and to N in parallel with their ratio (target <= 3x), the unchanged
re-push's time (target <= 1 s) and its ratio to a fresh push.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=20)
    p.add_argument("--data", type=Path, default=Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared/data")))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgedeploy-bench-") as tmp:
        base = Path(tmp)
        for k, d in (("CONFIG", "config"), ("STATE", "state"), ("CACHE", "cache")):
            os.environ[f"EDGEDEPLOY_{k}_DIR"] = str(base / d)
        return run(base, args.devices, args.data)


def run(base: Path, n: int, data: Path) -> int:
    from edgedeploy import api
    from edgedeploy.compile.package import ModelCard
    from edgedeploy.inventory import Device, Inventory
    from edgedeploy.localdevice import LoopbackSshd, NetnsLink, netns_available
    from edgedeploy_agent.bundle import Postprocess, Preprocess

    ok, why = netns_available()
    if not ok:
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    agent = str(Path(sys.executable).parent / "edgedeploy-agent")
    bundle = base / "mnist.edb"
    card = ModelCard(name="mnist", version="8", labels=[str(i) for i in range(10)],
                     preprocess=Preprocess(color="gray"), postprocess=Postprocess(top_k=3, softmax=True))  # fmt: skip
    api.build(data / "models" / "mnist-8_opset13.onnx", "cpu-x86_64", bundle, card)
    inv = Inventory.load(base / "config" / "devices.toml")
    links, servers, names = [], [], []
    try:
        for i in range(n + 1):
            link = NetnsLink(101 + i, tag="bf").up()
            links.append(link)
            sshd = LoopbackSshd(base / f"d{i}", host=link.device_ip, netns=link.ns).start()
            servers.append(sshd)
            name = f"bench-{i:02d}"
            root = str(base / f"d{i}" / "root")
            key = str(sshd.client_key)
            inv.add(Device(name=name, host=link.device_ip, port=sshd.port, user=sshd.user, key_file=key,
                           profile="cpu-x86_64", root=root, service="process", agent_command=agent))  # fmt: skip
            api.enroll(inv, name)
            names.append(name)
        size = bundle.stat().st_size
        print(f"bundle {size / 1e3:.0f} kB, {n} devices + 1, each an sshd in its own netns; agents in process mode")

        t, host0, all0 = time.perf_counter(), _host_cpu(), _machine_cpu()
        one = api.push_bundle(inv, names[0], bundle)
        t_one = time.perf_counter() - t
        host_one, all_one = _host_cpu() - host0, _machine_cpu() - all0
        assert one.outcome == "committed"

        t, host0, all0 = time.perf_counter(), _host_cpu(), _machine_cpu()
        many = api.rollout(inv, bundle, names[1:], api.Waves(canary=0), concurrency=n)
        t_many = time.perf_counter() - t
        host_many, all_many = _host_cpu() - host0, _machine_cpu() - all0
        assert many.exit_code() == 0, many.to_json()

        t = time.perf_counter()
        again = api.push_bundle(inv, names[0], bundle)
        t_again = time.perf_counter() - t
        assert again.outcome == "unchanged"

        t = time.perf_counter()
        forced = api.push_bundle(inv, names[0], bundle, api.PushOptions(force=True))
        t_forced = time.perf_counter() - t
        print(f"push to 1 device (fresh):            {t_one:6.2f} s")
        print(
            f"push to {n} devices (fresh, parallel): {t_many:6.2f} s   ratio {t_many / t_one:.2f}x one (target <= 3x)"
        )
        print(f"re-push, unchanged bundle:           {t_again:6.2f} s   (target <= 1 s)")
        print(f"re-push --force (restart + health):  {t_forced:6.2f} s   sent {forced.uploaded_bytes} bytes")
        print(f"ratio unchanged re-push / fresh push: {t_again / t_one:.2f}")
        print(f"phases of the push to 1 device: {one.timings}")
        print(f"CPU seconds, host process:   1 device {host_one:.2f}, {n} devices {host_many:.2f}")
        print(f"CPU seconds, whole machine:  1 device {all_one:.2f}, {n} devices {all_many:.2f} "
              f"on {os.cpu_count()} cores (the devices' sshd and agents share them here)")  # fmt: skip
        return 0 if t_many <= 3 * t_one and t_again <= 1.0 else 2
    finally:
        for name in names:
            subprocess.run([agent, "--root", str(inv.get(name).root), "stop"], capture_output=True)
        for s in servers:
            s.kill()
        for link in links:
            link.down_all()


def _host_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _machine_cpu() -> float:
    """Busy CPU seconds of the whole machine, from /proc/stat (user+nice+system+irq+softirq)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
