"""Pull-fleet benchmark: publish once, roll out over MQTT to N devices pulling from an OCI registry cache.

Servers as the tests start them (docker-registry origin + read-only endpoint + pull-through cache,
mosquitto with one user per device and the ACL). Devices:
  - `--real` real `edgedeploy-agent watch` processes (real deploys of a real mnist bundle);
  - the rest simulated, many per process: each a real MQTT session (its own broker user, client id =
    device name), real verification of the signed desired state with a pinned rollout key, real HTTP
    GETs of the OCI manifest and every blob it lacks from the cache with a sha256 check, then a status.
    They do not unpack or run the model (no deploy): that part is what the real agents measure.
The rollout is `rollout --via mqtt` (the same planner, waves and halt rules as SSH). Then a second
rollout in which 2 % of the simulated devices fail their health check shows the halt rule; then the
same first rollout over SSH to `--ssh-devices` loopback sshd devices with real agents, for comparison.

    .venv/bin/python bench/fleet_pull.py [--devices 1000] [--real 2] [--ssh-devices 20]

Prints the publish, the pull rollout (devices ok, time, broker memory, cache requests), the halt rule's
rollout, and the same rollout over SSH to real agents: the peer the pull rollout is compared with.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=1000, help="devices in the pull rollout (real + simulated)")
    p.add_argument("--real", type=int, default=2, help="real watching agents among them")
    p.add_argument("--ssh-devices", type=int, default=20, help="devices in the SSH comparison (0: skip)")
    p.add_argument("--procs", type=int, default=4, help="processes the simulated devices share")
    p.add_argument("--rate", type=float, default=200.0, help="desired-state publishes per second")
    p.add_argument("--data", type=Path, default=Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared/data")))
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory(prefix="edgedeploy-bench-pull-") as tmp:
        base = Path(tmp)
        for k, d in (("CONFIG", "config"), ("STATE", "state"), ("CACHE", "cache")):
            os.environ[f"EDGEDEPLOY_{k}_DIR"] = str(base / "host" / d)
        (base / "host" / "config").mkdir(parents=True)
        return run(base, args)


# --- simulated devices ------------------------------------------------------------------------------


def sim_worker(names: list[str], passwords: dict[str, str], broker_port: int, cache_url: str, root: str) -> None:
    """One process of simulated devices; runs until killed."""
    import hashlib
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    import paho.mqtt.client as mqtt

    from edgedeploy_agent.blobs import BlobStore
    from edgedeploy_agent.desired import DesiredRefused, rollout_trust, status_doc, status_topic, verify_desired
    from edgedeploy_agent.oci import OciPuller, parse_ref

    trust = rollout_trust(Path(root))
    pool = ThreadPoolExecutor(max_workers=16)
    puller = OciPuller(cache_url, BlobStore(Path(root)))  # only its manifest() is used: digest-checked
    have: dict[str, set[str]] = {n: set() for n in names}
    floor: dict[str, int | None] = dict.fromkeys(names)
    release: dict[str, str | None] = dict.fromkeys(names)
    clients: dict[str, Any] = {}

    def failing(name: str, rel: str) -> bool:
        try:
            spec = json.loads((Path(root) / "fail.json").read_text())
        except (OSError, ValueError):
            return False
        return bool(spec["release"] == rel and name in spec["names"])

    def work(name: str, payload: bytes) -> None:
        c = clients[name]

        def status(state: str, **kw: Any) -> None:
            c.publish(status_topic(name), status_doc(name, state, release=release[name], **kw), qos=1, retain=True)

        try:
            doc = verify_desired(payload, name, trust, floor[name])
        except DesiredRefused as e:
            status("refused", code=e.code, message=e.message)
            return
        if doc is None:
            return
        floor[name] = doc.serial
        base = {"rollout": doc.rollout, "ref": doc.ref, "serial": doc.serial, "wave": doc.wave}
        status("downloading", **base)
        ref = parse_ref(doc.ref)
        manifest = puller.manifest(ref)
        for d in [manifest["config"], *manifest["layers"]]:
            sha = d["digest"][7:]
            if sha in have[name]:
                continue
            with urllib.request.urlopen(f"{cache_url}/v2/{ref.repo}/blobs/sha256:{sha}", timeout=60) as r:
                body = r.read()
            if hashlib.sha256(body).hexdigest() != sha:
                status("refused", **base, code="blob-digest-mismatch", message=sha[:16])
                return
            have[name].add(sha)
        if failing(name, doc.release):
            status("rolled-back", **base, code="health-check-failed", message="simulated health-check failure")
            return
        release[name] = doc.release
        status("committed", **base, outcome="committed")

    for name in names:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv311)
        c.username_pw_set(name, passwords[name])
        c.will_set(status_topic(name), status_doc(name, "offline"), qos=1, retain=True)

        def on_connect(cl: Any, u: Any, f: Any, rc: Any, p: Any, name: str = name) -> None:
            cl.subscribe(f"edgedeploy/v1/desired/{name}", qos=1)
            cl.publish(status_topic(name), status_doc(name, "idle", release=release[name]), qos=1, retain=True)

        def on_message(cl: Any, u: Any, msg: Any, name: str = name) -> None:
            pool.submit(work, name, bytes(msg.payload))

        c.on_connect, c.on_message = on_connect, on_message
        c.reconnect_delay_set(1, 30)
        c.connect_async("127.0.0.1", broker_port, keepalive=60)
        c.loop_start()
        clients[name] = c
        time.sleep(0.002)  # no connect storm
    threading.Event().wait()


# --- the run ----------------------------------------------------------------------------------------


def run(base: Path, args: argparse.Namespace) -> int:
    from tests.helpers import Cli
    from tests.integration.pullfleet import PUBLISHER, start_pull_fleet

    from edgedeploy import api, pull_api
    from edgedeploy.compile.package import ModelCard
    from edgedeploy.fleet_servers import servers_available
    from edgedeploy.inventory import Device, Inventory
    from edgedeploy.publish import publish
    from edgedeploy.remote.execute import HealthPolicy
    from edgedeploy.remote.rollout import Waves
    from edgedeploy.signing import list_keys, sign_bundle
    from edgedeploy_agent.bundle import Postprocess, Preprocess
    from edgedeploy_agent.desired import rollout_trust

    missing = servers_available()
    if missing:
        print(f"cannot run: {missing}", file=sys.stderr)
        return 1
    n_real = min(args.real, args.devices)
    names = [f"d{i:04d}" for i in range(args.devices)]
    real, sims = names[:n_real], names[n_real:]
    raw = base / "mnist.edb"
    card = ModelCard(name="mnist", version="8", labels=[str(i) for i in range(10)],
                     preprocess=Preprocess(color="gray"), postprocess=Postprocess(top_k=3, softmax=True))  # fmt: skip
    api.build(args.data / "models" / "mnist-8_opset13.onnx", "cpu-x86_64", raw, card)
    video = base / "digits.avi"
    _video(args.data, video)

    fleet = start_pull_fleet(base / "pull", Cli(), names)
    procs: list[Any] = []
    try:
        fleet.setup_host(base / "host")
        for name in real:
            fleet.add(name, f"file:{video}")
        signed = [base / f"signed-{i}.edb" for i in range(2)]
        for path in signed:
            sign_bundle(raw, "fleet-1", path)
        inv = Inventory.load(fleet.inventory)
        for name in sims:
            inv.devices[name] = Device(name=name, host="127.0.0.1", profile="cpu-x86_64", tags=["lab"],
                                       root=str(base / "sim" / name), service="process", transport="local")  # fmt: skip
        inv.save()
        sim_root = base / "sim-shared"
        keys = {k.name: k.public for k in list_keys()}
        rollout_trust(sim_root).replace([keys["rollout-1"]])

        t0 = time.monotonic()
        pub = publish(signed[0], f"{fleet.origin.address}/models/mnist", user=PUBLISHER[0], password=PUBLISHER[1])
        t_pub = time.monotonic() - t0
        print(f"publish: {pub.uploaded_bytes / 1e6:.2f} MB in {len(pub.uploaded)} blobs, {t_pub:.2f} s -> {pub.ref}")
        publish(signed[1], f"{fleet.origin.address}/models/mnist", user=PUBLISHER[0], password=PUBLISHER[1])

        rss0 = fleet.broker.rss_kib()
        chunks = [sims[i :: args.procs] for i in range(args.procs)]
        ctx = multiprocessing.get_context("fork")  # before any thread starts here
        for chunk in chunks:
            if chunk:
                pw = {n: fleet.broker.devices[n] for n in chunk}
                pr = ctx.Process(target=sim_worker, args=(chunk, pw, fleet.broker.port, fleet.cache.url, str(sim_root)))
                pr.start()
                procs.append(pr)
        for name in real:
            fleet.start(name)
        t0 = time.monotonic()
        seen = pull_api.fleet_status_via_mqtt(names, settle=300)
        up = sum(1 for s in seen.values() if s)
        print(f"connected: {up}/{len(names)} devices reported in {time.monotonic() - t0:.1f} s; "
              f"broker RSS {rss0} KiB before, {fleet.broker.rss_kib()} KiB now")  # fmt: skip

        traffic0 = fleet.cache.traffic()
        health = HealthPolicy(timeout=120)
        t0 = time.monotonic()
        state = pull_api.rollout_via_mqtt(inv, signed[0], names, Waves(1, "50%", 0.1), health=health,
                                          rate=args.rate, pull_timeout=300)  # fmt: skip
        took = time.monotonic() - t0
        traffic1 = fleet.cache.traffic()
        reqs = {k: v - traffic0[0].get(k, 0) for k, v in traffic1[0].items() if v - traffic0[0].get(k, 0)}
        ok = len(state.succeeded)
        real_ok = sum(1 for n in real if fleet.devices[n].current() == state.release)
        print(f"pull rollout to {len(names)} devices ({len(real)} real agents): {state.status}, {ok} ok, "
              f"{len(state.failed)} failed in {took:.1f} s (canary + 2 waves, rate {args.rate:.0f}/s); "
              f"real agents on the new release: {real_ok}/{len(real)}")  # fmt: skip
        print(f"  broker RSS {fleet.broker.rss_kib()} KiB; cache requests {reqs}; "
              f"bytes served by the cache {(traffic1[1] - traffic0[1]) / 1e6:.1f} MB; "
              f"origin/read-only endpoint requests {fleet.readonly.requests()}")  # fmt: skip

        # halt rule: 2 % of the simulated devices fail the health check of the second bundle
        failing = sims[1::50][: max(1, round(len(names) * 0.02))]
        from edgedeploy_agent.bundle import read_manifest

        rel2 = read_manifest(signed[1]).release_name
        (sim_root / "fail.json").write_text(json.dumps({"release": rel2, "names": failing}))
        t0 = time.monotonic()
        halted = pull_api.rollout_via_mqtt(inv, signed[1], names, Waves(1, "10%", 0.01),
                                           health=health, rate=args.rate, pull_timeout=300)  # fmt: skip
        print(f"halt rule: {len(failing)} devices ({len(failing) / len(names):.0%}) fail health, --max-fail 1% "
              f"(budget {halted.fail_budget}): {halted.status} ({halted.halted_reason}) after "
              f"{time.monotonic() - t0:.1f} s; {len(halted.succeeded)} ok, {len(halted.failed)} failed, "
              f"{len(halted.untouched)} never told")  # fmt: skip
    finally:
        for pr in procs:
            pr.kill()
            pr.join(5)
        fleet.close()

    if args.ssh_devices:
        _ssh_comparison(base, signed[0], args.ssh_devices, video)
    return 0


def _ssh_comparison(base: Path, bundle: Path, n: int, video: Path) -> None:
    from tests.helpers import agent

    from edgedeploy import api
    from edgedeploy.inventory import Device, Inventory
    from edgedeploy.localdevice import LoopbackSshd
    from edgedeploy.remote.execute import HealthPolicy
    from edgedeploy.remote.rollout import Waves

    agent_cmd = str(Path(sys.executable).parent / "edgedeploy-agent")
    inv = Inventory.load(base / "ssh" / "devices.toml")
    servers = []
    try:
        for i in range(n):
            sshd = LoopbackSshd(base / "ssh" / f"s{i}").start()
            servers.append(sshd)
            name = f"s{i:02d}"
            inv.add(Device(name=name, host=sshd.host, port=sshd.port, user=sshd.user, key_file=str(sshd.client_key),
                           profile="cpu-x86_64", tags=["ssh"], root=str(base / "ssh" / f"root{i}"), service="process",
                           agent_command=agent_cmd, source=f"file:{video}"))  # fmt: skip
            api.enroll(inv, name)
        names = sorted(inv.devices)
        t0 = time.monotonic()
        state = api.rollout(inv, bundle, names, Waves(1, "50%", 0.1), concurrency=8,
                            health=HealthPolicy(timeout=120))  # fmt: skip
        print(f"ssh rollout to {n} devices (real agents, concurrency 8): {state.status}, {len(state.succeeded)} ok in "
              f"{time.monotonic() - t0:.1f} s")  # fmt: skip
    finally:
        for i in range(n):
            agent("--root", str(base / "ssh" / f"root{i}"), "--json", "stop")
        for s in servers:
            s.stop()


def _video(data: Path, path: Path) -> None:
    import gzip

    import cv2
    import numpy as np

    with gzip.open(data / "mnist" / "t10k-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:100]
    w = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 25.0, (112, 112))
    for img in images:
        w.write(cv2.cvtColor(cv2.resize(img, (112, 112)), cv2.COLOR_GRAY2BGR))
    w.release()


if __name__ == "__main__":
    sys.exit(main())
