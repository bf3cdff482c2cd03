"""Pull faults for real: a cut link, the registry killed mid-blob, a cold cache answering 200 to a range
request, a registry down, a corrupt blob, a tampered config, desired state signed by a foreign key or for
another device, the broker's ACL, a broker restarted mid-rollout and a device that reconnects after its wave
was published. Each ends with the device on its old or its new release, never without one."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edgedeploy.publish import RegistryClient, oci_manifest, publish
from edgedeploy.remote.blobs import Blob, bundle_blobs
from edgedeploy.remote.mqtt import Controller, MqttSettings, desired_payload
from edgedeploy_agent.blobs import BlobStore
from edgedeploy_agent.bundle import canonical_json, read_manifest
from edgedeploy_agent.desired import DesiredHealth, desired_topic
from edgedeploy_agent.oci import DigestMismatch, OciPuller, PullError, parse_ref
from tests.helpers import BIN, Cli
from tests.integration.pullfleet import PUBLISHER, FaultProxy, PullFleet, signed, wait_for

pytestmark = pytest.mark.integration


def _publish(fleet: PullFleet, bundle: Path) -> str:
    return publish(bundle, f"{fleet.origin.address}/models/mnist", user=PUBLISHER[0], password=PUBLISHER[1]).ref


@pytest.fixture
def two_releases(cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, tmp_path: Path) -> tuple[Path, Path]:
    return signed(cli, mnist_bundle, tmp_path / "a.edb"), signed(cli, mnist_bundle, tmp_path / "b.edb")


def test_pull_resumes_after_a_cut_link_and_restarts_on_a_cold_cache(
    pull_fleet: PullFleet, two_releases: tuple[Path, Path], tmp_path: Path
) -> None:
    fleet = pull_fleet
    ref = parse_ref(_publish(fleet, two_releases[0]))
    big = max(bundle_blobs(two_releases[0]).blobs, key=lambda b: b.size)
    assert big.size > 64 << 10

    # the link goes down 20000 bytes into each blob: the pull fails, the part stays
    store = BlobStore(tmp_path / "dev-a")
    with FaultProxy(fleet.readonly.url) as proxy:
        proxy.cut_after = 20000
        with pytest.raises(PullError):
            OciPuller(proxy.url, store).pull(ref)
        assert 0 < store.partial_bytes(big.sha256) < big.size or store.has(big.sha256) is False
        proxy.cut_after = None
        pulled = OciPuller(proxy.url, store).pull(ref)  # the next try asks for the rest
    ranged = [(rng, status) for path, rng, status in proxy.seen if big.sha256 in path and rng]
    assert ranged and all(status == 206 for _, status in ranged), proxy.seen
    assert store.has(big.sha256) and pulled.restarts == 0

    # a cold pull-through cache answers a range request with the whole blob: that blob starts again
    store = BlobStore(tmp_path / "dev-b")
    store.init()
    (store.incoming / f"{big.sha256}.part").write_bytes(big.local.read_bytes()[:5000])
    pulled = OciPuller(fleet.cache.url, store).pull(ref)
    assert pulled.restarts == 1 and store.has(big.sha256)
    assert hashlib.sha256(store.path(big.sha256).read_bytes()).hexdigest() == big.sha256

    # a corrupt blob is never kept
    store = BlobStore(tmp_path / "dev-c")
    with FaultProxy(fleet.readonly.url) as proxy:
        proxy.corrupt = big.sha256
        with pytest.raises(DigestMismatch):
            OciPuller(proxy.url, store).pull(ref)
    assert not store.has(big.sha256) and not (store.incoming / big.sha256).exists()


def _tampered_ref(fleet: PullFleet, bundle: Path) -> str:
    """The bundle re-published with a changed manifest.json (config) and the original signature."""
    _publish(fleet, bundle)  # the signature and artifacts are in the registry; only the config changes
    blobs = bundle_blobs(bundle)
    data = json.loads(blobs.blobs[0].local.read_bytes())
    data["model"]["version"] = "9-tampered"
    body = canonical_json(data)
    fake = bundle.parent / "tampered-manifest.json"
    fake.write_bytes(body)
    sha = hashlib.sha256(body).hexdigest()
    client = RegistryClient(fleet.origin.address, "models/mnist", *PUBLISHER)
    client.push_blob(Blob(sha, len(body), "manifest.json", fake))
    forged = type(blobs)(
        blobs.manifest, sha, blobs.signature_sha, (Blob(sha, len(body), "manifest.json", fake), *blobs.blobs[1:])
    )
    doc = oci_manifest(forged)
    digest = client.put_manifest("tampered", doc)
    return f"{fleet.origin.address}/models/mnist@{digest}"


def test_refusals_leave_the_device_on_its_release(
    cli: Cli, pull_fleet: PullFleet, two_releases: tuple[Path, Path], hermetic: Path
) -> None:
    fleet = pull_fleet
    dev = fleet.start("dev1")
    good = _publish(fleet, two_releases[0])
    release = read_manifest(two_releases[0]).release_name
    assert cli("keys", "generate", "foreign").code == 0
    settings = MqttSettings(
        broker=fleet.broker.controller_address, password_file=str(hermetic / "config" / "mqtt-controller")
    )
    health = DesiredHealth(timeout_s=60)
    serial = [100]

    def send(c: Controller, key: str = "rollout-1", device: str = "dev1", ref: str = good, **kw: float) -> dict:
        serial[0] += 1
        c.publish_desired("dev1", desired_payload(key, device, ref, "", "t", 0, serial[0], health=health, **kw))
        s = serial[0]
        st = c.wait_status(
            "dev1",
            lambda st: (
                st.get("state") in ("committed", "refused", "rolled-back")
                and (st.get("serial") == s or st.get("code") == "desired-refused")
            ),
            120,
        )
        return st

    with Controller(settings, client_id="test-controller") as c:
        st = send(c)
        assert st["state"] == "committed" and dev.current() == release, dev.log()
        c.statuses.pop("dev1")
        for kw, words in (
            ({"key": "foreign"}, "does not pin"),
            ({"device": "dev2"}, "is for device 'dev2'"),
            ({"expires_hours": 1e-9}, "expired"),
        ):
            st = send(c, **kw)  # type: ignore[arg-type]
            assert st["state"] == "refused" and words in st["message"], (kw, st)
            assert dev.current() == release
            c.statuses.pop("dev1")

        st = send(c, ref=_tampered_ref(fleet, two_releases[1]))
        assert (st["state"], st["code"]) == ("refused", "bad-signature"), st
        assert dev.current() == release

        # the device's broker account may not write desired state (its own or another's)
        forged = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="dev2", protocol=mqtt.MQTTv311)
        forged.username_pw_set("dev2", fleet.broker.devices["dev2"])
        forged.connect("127.0.0.1", fleet.broker.port)
        forged.loop_start()
        for topic in (desired_topic(d, m) for d in ("dev1", "dev2") for m in ("default", "cam2")):
            forged.publish(topic, b'{"doc": {}, "sig": {}}', qos=1, retain=True).wait_for_publish(5)
        forged.loop_stop()
        forged.disconnect()
        time.sleep(1)
        assert dev.current() == release and "malformed" not in json.dumps(c.statuses)

        # the watch process dies: the broker publishes its last will, which names the release it runs
        fleet.stop("dev1", kill=True)
        st = c.wait_status("dev1", lambda st: st.get("state") == "offline", 30)
        assert (st.get("state"), st.get("release")) == ("offline", release), st


def test_corrupt_blob_and_registry_down(
    cli: Cli, pull_fleet: PullFleet, two_releases: tuple[Path, Path], hermetic: Path
) -> None:
    fleet = pull_fleet
    a, b = two_releases
    ref_a, ref_b = _publish(fleet, a), _publish(fleet, b)
    new_b = bundle_blobs(b).manifest_sha  # b shares its artifacts with a: its manifest is what dev1 lacks
    settings = MqttSettings(
        broker=fleet.broker.controller_address, password_file=str(hermetic / "config" / "mqtt-controller")
    )
    with FaultProxy(fleet.readonly.url) as proxy:
        dev = fleet.devices["dev1"]
        cfg = json.loads((dev.root / "watch.json").read_text())
        cfg["registry_url"] = proxy.url
        (dev.root / "watch.json").write_text(json.dumps(cfg))
        fleet.start("dev1")
        with Controller(settings, client_id="test-controller") as c:
            done = lambda s: lambda st: st.get("serial") == s and st.get("state") in ("committed", "refused")  # noqa: E731
            c.publish_desired(
                "dev1", desired_payload("rollout-1", "dev1", ref_a, "", "t", 0, 201, health=DesiredHealth())
            )
            assert c.wait_status("dev1", done(201), 120).get("state") == "committed", dev.log()
            release_a = dev.current()

            proxy.corrupt = new_b
            c.publish_desired(
                "dev1", desired_payload("rollout-1", "dev1", ref_b, "", "t", 0, 202, health=DesiredHealth())
            )
            st = c.wait_status("dev1", done(202), 60)
            assert (st.get("state"), st.get("code")) == ("refused", "blob-digest-mismatch"), st
            assert dev.current() == release_a
            proxy.corrupt = None

            # the registry behind the device's endpoint is killed; the device keeps its release and retries
            fleet.readonly.kill()
            c.publish_desired(
                "dev1", desired_payload("rollout-1", "dev1", ref_b, "", "t", 0, 203, health=DesiredHealth())
            )
            st = c.wait_status("dev1", lambda st: st.get("serial") == 203 and st.get("code") == "pull-failed", 30)
            assert st.get("state") == "downloading" and dev.current() == release_a, st
            fleet.readonly.start()
            st = c.wait_status("dev1", done(203), 120)
            assert st.get("state") == "committed" and dev.current() == read_manifest(b).release_name, dev.log()


def test_broker_restart_mid_rollout_and_a_late_device(
    cli: Cli, pull_fleet: PullFleet, two_releases: tuple[Path, Path]
) -> None:
    fleet = pull_fleet
    bundle = two_releases[0]
    release = read_manifest(bundle).release_name
    assert (
        cli(
            "publish",
            str(bundle),
            "--registry",
            f"{fleet.origin.address}/models/mnist",
            "--user",
            PUBLISHER[0],
            env={"EDGEDEPLOY_REGISTRY_PASSWORD": PUBLISHER[1]},
        ).code
        == 0
    )
    fleet.start("dev1")  # dev2 is off when its wave is published
    rollout = subprocess.Popen(
        [str(BIN / "edgedeploy"), "rollout", str(bundle), "--group", "lab", "--via", "mqtt", "--canary", "1",
         "--timeout", "20", "--pull-timeout", "5", "--json", *fleet.args()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # the broker restarts while the canary is being updated
    wait_for(lambda: (fleet.devices["dev1"].root / "watch" / "state.json").exists(), 60)
    fleet.broker.stop()
    time.sleep(1)
    fleet.broker.start()
    out, err = rollout.communicate(timeout=180)
    assert rollout.returncode == 5, out + err
    state = json.loads(out)
    assert state["devices"]["dev1"]["status"] == "committed", out + fleet.devices["dev1"].log()
    assert (state["devices"]["dev2"]["status"], state["devices"]["dev2"]["code"]) == ("failed", "timeout")
    assert fleet.devices["dev2"].current() is None

    # dev2 comes online later: the retained desired state (kept across the broker restart) brings it along
    fleet.start("dev2")
    wait_for(lambda: fleet.devices["dev2"].current() == release, 90)
    r = cli("rollout", "--resume", "--json", *fleet.args(), timeout=180)
    assert r.code == 0, r.out + r.err
    assert json.loads(r.out)["devices"]["dev2"]["status"] in ("committed", "unchanged")


def test_registry_killed_mid_blob_then_the_pull_resumes(pull_fleet: PullFleet, tmp_path: Path) -> None:
    """SIGKILL to the registry process while a 48 MiB blob is flowing; restarted, the pull asks for the rest."""
    import os

    from edgedeploy.signing import sign_bundle
    from tests.agent.bundles import make_bundle

    fleet = pull_fleet
    sign_bundle(make_bundle(tmp_path / "big", lib_bytes=os.urandom(48 << 20)), "fleet-1", tmp_path / "big.edb")
    ref = parse_ref(_publish(fleet, tmp_path / "big.edb"))
    big = max(bundle_blobs(tmp_path / "big.edb").blobs, key=lambda b: b.size)
    store = BlobStore(tmp_path / "dev")
    killed: list[int] = []

    def kill_midway(done: int, total: int) -> None:
        if done > 4 << 20 and not killed:
            killed.append(done)
            fleet.readonly.kill()

    with pytest.raises(PullError):
        OciPuller(fleet.readonly.url, store).pull(ref, kill_midway)
    part = store.partial_bytes(big.sha256)
    assert killed and 0 < part < big.size, (killed, part)
    fleet.readonly.start()
    pulled = OciPuller(fleet.readonly.url, store).pull(ref)
    assert store.has(big.sha256) and pulled.restarts == 0 and pulled.fetched_bytes < big.size


def test_ctrl_c_stops_waiting_and_resume_finishes(
    cli: Cli, pull_fleet: PullFleet, two_releases: tuple[Path, Path], hermetic: Path
) -> None:
    import signal

    fleet = pull_fleet
    bundle = two_releases[0]
    _publish(fleet, bundle)
    fleet.start("dev1")  # dev2 is off: its wait is what Ctrl-C interrupts
    rollout = subprocess.Popen(
        [str(BIN / "edgedeploy"), "rollout", str(bundle), "--group", "lab", "--via", "mqtt", "--canary", "0",
         "--timeout", "120", "--json", *fleet.args()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    release = read_manifest(bundle).release_name
    wait_for(lambda: fleet.devices["dev1"].current() == release, 90)

    def dev1_recorded() -> bool:  # the runner saves its state at most once a second: Ctrl-C after it has
        for path in (hermetic / "state").glob("rollouts/*.json"):  # (before, on a loaded machine, dev1 was
            try:  # sometimes asked again on --resume and answered "unchanged")
                return json.loads(path.read_text())["devices"]["dev1"]["status"] == "committed"
            except (ValueError, KeyError):
                return False
        return False

    wait_for(dev1_recorded, 60)
    rollout.send_signal(signal.SIGINT)
    out, err = rollout.communicate(timeout=30)
    assert rollout.returncode == 130 and "interrupted" in err and "Traceback" not in err, out + err
    (path,) = (hermetic / "state").glob("rollouts/*.json")
    state = json.loads(path.read_text())
    assert state["status"] == "interrupted", state
    assert state["devices"]["dev2"]["status"] in ("failed", "running", "pending"), state["devices"]

    fleet.start("dev2")
    r = cli("rollout", "--resume", "--json", *fleet.args(), timeout=180)
    assert r.code == 0, r.out + r.err
    done = json.loads(r.out)["devices"]
    # dev1 ended ok and is not asked again; dev2 found the retained state of the interrupted run when it came
    # up, so the resumed publish may find it already there (unchanged)
    assert done["dev1"]["status"] == "committed" and done["dev2"]["status"] in ("committed", "unchanged"), done
    assert fleet.devices["dev2"].current() == release
