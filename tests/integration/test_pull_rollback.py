"""`rollback --via mqtt` against a real mosquitto (issue 40 #5, issue 41 #5): each device goes back to the release
it ran when the rollout started (a device whose new release failed health stays where it is, a device that was
offline then and took the release later goes back), all devices share one deadline, and the results are the
SSH fan-out's FleetResult."""

from __future__ import annotations

import json
import time
from pathlib import Path

import cv2
import pytest

from edgedeploy.errors import InputError
from edgedeploy.fleet_servers import CONTROLLER, LocalBroker, servers_available
from edgedeploy.publish import publish
from edgedeploy.pull_api import rollback_via_mqtt
from edgedeploy.remote.fleet import FleetResult
from edgedeploy.remote.rollout_runner import rollouts_dir
from edgedeploy.signing import generate_key
from edgedeploy_agent.bundle import read_manifest
from tests.helpers import Cli, agent, assert_one_line_error, require
from tests.integration.conftest import LabeledVideo
from tests.integration.pullfleet import PUBLISHER, PullFleet, signed, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.fleet_servers]


def short_video(src: Path, out: Path, frames: int) -> Path:
    """The first `frames` frames of `src`: a source that ends before a health check asking for more."""
    cap = cv2.VideoCapture(str(src))
    w = cv2.VideoWriter(str(out), cv2.VideoWriter.fourcc(*"MJPG"), 25.0, (112, 112))
    for _ in range(frames):
        ok, frame = cap.read()
        assert ok
        w.write(frame)
    w.release()
    cap.release()
    return out


def test_rollback_goes_to_what_each_device_ran_before_the_rollout(
    cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, mnist_video: LabeledVideo, tmp_path: Path, hermetic: Path
) -> None:
    fleet = pull_fleet
    a, b = signed(cli, mnist_bundle, tmp_path / "a.edb"), signed(cli, mnist_bundle, tmp_path / "b.edb")
    release_a, release_b = read_manifest(a).release_name, read_manifest(b).release_name
    for bundle in (a, b):
        publish(bundle, f"{fleet.origin.address}/models/mnist", user=PUBLISHER[0], password=PUBLISHER[1])
    # dev1's camera shows 10 frames, then ends: enough for a plain health check, not for --min-inferences 50
    short = short_video(mnist_video.path, tmp_path / "short.avi", 10)
    assert agent("--root", str(fleet.devices["dev1"].root), "init", "--source", f"file:{short}").code == 0
    dev1, dev2 = fleet.start("dev1"), fleet.start("dev2")
    lab = ("--group", "lab", "--via", "mqtt", "--canary", "0", "--json", *fleet.args())
    r = cli("rollout", str(a), *lab, timeout=240)
    assert r.code == 0, r.out + r.err + dev1.log() + dev2.log()
    assert dev1.current() == dev2.current() == release_a

    # dev2 goes offline (its last will: offline, running A); B fails its health check on dev1
    fleet.stop("dev2")
    r = cli("rollout", str(b), *lab, "--min-inferences", "50", "--timeout", "20", "--pull-timeout", "10", timeout=240)
    assert r.code == 1, r.out + r.err
    state = json.loads(r.out)
    assert state["options"]["before"] == {"dev1": release_a, "dev2": release_a}, state["options"]
    assert state["devices"]["dev1"]["code"] == "health-check-failed", state["devices"]
    assert state["devices"]["dev2"]["code"] == "timeout", state["devices"]
    assert dev1.current() == release_a

    # dev2 comes back, finds B retained and takes it (its camera has all 300 frames)
    dev2 = fleet.start("dev2")

    def dev2_committed_b() -> bool:  # `current` moves at activation; the status says committed after health
        st = json.loads(cli("status", "dev2", "--via", "mqtt", "--json", *fleet.args()).out)["devices"]["dev2"]
        return bool(st) and (st["state"], st["release"]) == ("committed", release_b)

    wait_for(dev2_committed_b, 120)

    r = cli("rollback", "--group", "lab", "--via", "mqtt", "--json", *fleet.args(), timeout=240)
    assert r.code == 0, r.out + r.err + dev1.log() + dev2.log()
    back = json.loads(r.out)
    assert back["failed"] == {}, back
    assert back["succeeded"]["dev1"] == {"outcome": "unchanged", "release": release_a, "previous": release_a}
    assert back["succeeded"]["dev2"] == {"outcome": "rolled-back", "release": release_a, "previous": release_b}
    assert dev1.current() == dev2.current() == release_a
    # the text form is the SSH one's
    r = cli("rollback", "--group", "lab", "--via", "mqtt", *fleet.args(), timeout=240)
    assert r.code == 0 and f"dev1: already on {release_a}" in r.out and f"dev2: already on {release_a}" in r.out, r


def test_rollback_shares_one_deadline_and_returns_a_fleet_result(hermetic: Path, tmp_path: Path) -> None:
    """Three devices that never answer cost one timeout, not three; a device the rollout did not record fails on
    its own; a rollout recorded by an older edgedeploy (previous refs, no releases) is refused in one line."""
    require("FLEET_SERVERS", servers_available())
    names = ["d1", "d2", "d3", "d4"]
    with LocalBroker(dict.fromkeys(names, "pw"), "ctl-pw") as broker:
        generate_key("rollout-1")
        pw = hermetic / "config" / "mqtt-controller"
        pw.write_text("ctl-pw")
        (hermetic / "config" / "fleet.toml").write_text(
            f'[mqtt]\nbroker = "{broker.controller_address}"\nusername = "{CONTROLLER}"\npassword_file = "{pw}"\n'
            '[rollout]\nkey = "rollout-1"\n'
        )
        rollouts_dir().mkdir(parents=True)
        record = {"id": "20260101T000000-abcdefgh", "options": {"via": "mqtt", "before": {}}}
        record["options"]["before"] = {"d1": "toy-1-a", "d2": "toy-1-a", "d3": "toy-1-b"}
        (rollouts_dir() / "20260101T000000-abcdefgh.json").write_text(json.dumps(record))

        t0 = time.monotonic()
        fleet = rollback_via_mqtt(names, health_timeout=1.0, margin=2.0)  # one 3 s deadline
        took = time.monotonic() - t0
        assert isinstance(fleet, FleetResult) and not fleet.succeeded
        assert {n: e.code for n, e in fleet.failed.items()} == {  # type: ignore[attr-defined]
            "d1": "timeout", "d2": "timeout", "d3": "timeout", "d4": "no-previous",
        }  # fmt: skip
        assert took < 3.0 + 1.0 + 3.0, took  # one deadline (+ 1 s reading statuses), not 3 x 3 s
        assert fleet.exit_code == 1

        inv = tmp_path / "devices.toml"
        inv.write_text('[devices.d4]\nhost = "127.0.0.1"\nprofile = "cpu-x86_64"\ntransport = "local"\n')
        r = Cli()("rollback", "d4", "--via", "mqtt", "--inventory", str(inv), "--json")
        assert r.code == 1 and json.loads(r.out)["failed"]["d4"]["code"] == "no-previous", r

        old = {"id": "20260102T000000-abcdefgh", "options": {"via": "mqtt", "previous_refs": {"d1": "h:1/m@sha256:0"}}}
        (rollouts_dir() / "20260102T000000-abcdefgh.json").write_text(json.dumps(old))
        with pytest.raises(InputError, match="does not record what its devices ran"):
            rollback_via_mqtt(names, health_timeout=1.0)
        assert_one_line_error(
            Cli()("rollback", "d4", "--via", "mqtt", "--inventory", str(inv)), 2, "does not record what its devices"
        )
