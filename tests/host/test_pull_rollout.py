"""Pull rollouts on the host: the OCI mapping, registry names, statuses as planner facts, signed desired state."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from edgedeploy.errors import InputError
from edgedeploy.publish import oci_manifest, parse_registry
from edgedeploy.remote.blobs import bundle_blobs
from edgedeploy.remote.mqtt import desired_payload, last_status, load_fleet_config
from edgedeploy.remote.mqtt_rollout import RateLimit, slot_status, status_facts
from edgedeploy.remote.rollout import plan_rollout
from edgedeploy.signing import generate_key, sign_bundle
from edgedeploy_agent.desired import DesiredHealth, rollout_trust, verify_desired
from edgedeploy_agent.oci import CONFIG_MEDIA_TYPE, SIGNATURE_MEDIA_TYPE, parse_ref
from tests.agent.bundles import make_bundle
from tests.helpers import Cli, assert_one_line_error


def test_bundle_maps_onto_an_oci_artifact_with_no_format_change(tmp_path: Path) -> None:
    generate_key("k")
    signed = sign_bundle(make_bundle(tmp_path / "b"), "k", tmp_path / "s.edb")
    blobs = bundle_blobs(tmp_path / "s.edb")
    doc = json.loads(oci_manifest(blobs))
    assert doc["config"] == {
        "mediaType": CONFIG_MEDIA_TYPE, "digest": f"sha256:{hashlib.sha256(signed.canonical_bytes()).hexdigest()}",
        "size": len(signed.canonical_bytes()),
    }  # fmt: skip
    assert doc["layers"][0]["mediaType"] == SIGNATURE_MEDIA_TYPE
    assert {ly["digest"][7:] for ly in doc["layers"][1:]} == {a.sha256 for a in signed.artifacts}
    assert oci_manifest(bundle_blobs(tmp_path / "s.edb")) == oci_manifest(blobs)  # one digest per bundle


@pytest.mark.parametrize("spec", ["127.0.0.1:5000", "127.0.0.1:5000/", "/models", "h:5000/Models", "h:x/m"])
def test_bad_registry_names_are_input_errors(spec: str) -> None:
    with pytest.raises(InputError, match="HOST:PORT/REPO"):
        parse_registry(spec)
    assert parse_registry("127.0.0.1:5000/models/mnist") == ("127.0.0.1:5000", "models/mnist")
    assert parse_ref("127.0.0.1:5000/models/mnist@sha256:" + "0" * 64).repo == "models/mnist"


def test_retained_statuses_feed_the_same_planner() -> None:
    facts = {
        "a": status_facts({"state": "committed", "release": "r2"}),
        "b": status_facts({"state": "committed", "release": "r1"}),
        "c": status_facts({"state": "offline", "release": "r2"}),
        "d": status_facts(None),
    }
    assert facts["d"] == "no status on the broker (never connected)"
    state = plan_rollout("id", "b.edb", "r2", list(facts), facts, canary=1, wave="1")
    assert state.devices["a"].detail == "already runs this bundle (no-op)"
    assert [state.devices[n].wave for n in "bcd"] == [0, 1, 2]  # an offline device is planned, not a no-op


def test_desired_payload_verifies_on_a_device_pinning_the_rollout_key(tmp_path: Path) -> None:
    key = generate_key("rollout")
    trust = rollout_trust(tmp_path)
    trust.replace([key.public])
    payload = desired_payload(
        "rollout", "cam-01", "h:1/m@sha256:" + "1" * 64, "r", "id", 2, 7, health=DesiredHealth(min_inferences=5)
    )
    doc = verify_desired(payload, "cam-01", trust, 7)
    assert doc is not None and (doc.wave, doc.serial, doc.health.min_inferences) == (2, 7, 5)


def test_fleet_config_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_fleet_config(tmp_path / "fleet.toml")
    (tmp_path / "fleet.toml").write_text('[mqtt]\nbrokr = "x"\n')
    with pytest.raises(InputError, match="fleet.toml"):
        load_fleet_config(tmp_path / "fleet.toml")


def test_a_wait_without_outcome_quotes_the_devices_reason_for_that_document() -> None:
    pulling = {"state": "downloading", "serial": 7, "code": "pull-failed", "message": "cannot reach the registry"}
    assert last_status(pulling, 7) == "last status downloading; it reports pull-failed: cannot reach the registry"
    # a reason about an older document is not this one's: only the state is said
    assert last_status({**pulling, "serial": 6}, 7) == "last status downloading"
    assert last_status({"state": "offline", "serial": 7}, 7) == "last status offline"
    assert last_status({}, 7) == "no status"


def test_rate_limit_spaces_publishes() -> None:
    limit = RateLimit(50.0)
    t0 = time.monotonic()
    for _ in range(11):
        limit.wait()
    assert time.monotonic() - t0 >= 10 / 50 - 0.01


def test_pull_commands_fail_in_one_line(cli: Cli, tmp_path: Path, hermetic: Path) -> None:
    from edgedeploy.localdevice import free_port

    assert cli("keys", "generate", "k").code == 0
    bundle = tmp_path / "s.edb"
    assert cli("sign", str(make_bundle(tmp_path / "b")), "--key", "k", "-o", str(bundle)).code == 0
    closed = f"127.0.0.1:{free_port()}"
    assert_one_line_error(cli("publish", str(bundle), "--registry", f"{closed}/m"), 4, "cannot reach the registry")
    assert_one_line_error(
        cli("publish", str(make_bundle(tmp_path / "u")), "--registry", f"{closed}/m"), 2, "not signed"
    )
    inv = tmp_path / "devices.toml"
    inv.write_text('[devices.d1]\nhost = "127.0.0.1"\nprofile = "cpu-x86_64"\ntags = ["lab"]\ntransport = "local"\n')
    args = ("--group", "lab", "--via", "mqtt", "--inventory", str(inv))
    assert_one_line_error(cli("rollout", str(bundle), *args), 2, "fleet.toml does not exist")
    assert_one_line_error(cli("rollout", str(bundle), "--group", "lab", "--via", "carrier-pigeon"), 2, "--via")
    (hermetic / "config" / "fleet.toml").write_text(f'[mqtt]\nbroker = "{closed}"\n[rollout]\nkey = "k"\n')
    assert_one_line_error(cli("rollout", str(bundle), *args), 2, "has not been published")
    assert_one_line_error(cli("status", *args), 3, "cannot reach the MQTT broker")


def test_the_rollout_key_is_never_pinned_as_a_bundle_key(hermetic: Path) -> None:
    from edgedeploy.signing import fleet_public_keys

    bundle_key, rollout_key = generate_key("fleet-1"), generate_key("rollout-1")
    assert sorted(fleet_public_keys()) == sorted([bundle_key.public, rollout_key.public])
    (hermetic / "config" / "fleet.toml").write_text('[mqtt]\nbroker = "b:1883"\n[rollout]\nkey = "rollout-1"\n')
    assert fleet_public_keys() == [bundle_key.public]


def test_statuses_are_read_into_the_model_or_unreadable() -> None:
    from edgedeploy.pull_api import releases_before
    from edgedeploy.remote.mqtt import desired_serial, read_status
    from edgedeploy_agent.desired import status_doc

    ok = read_status("cam-01", status_doc("cam-01", "committed", release="r1", serial=4, floor=4, extra={"a": 1}))
    assert ok["state"] == "committed" and ok["floor"] == 4 and "extra" not in ok and "updated" in ok
    for payload in (b"[" * 100000, b"[" * 60000, b"[1, 2]", b'"text"', status_doc("cam-02", "idle")):
        st = read_status("cam-01", payload)
        assert (st["state"], st["code"]) == ("unreadable", "unreadable") and st["message"], payload[:20]
        assert isinstance(status_facts(st), str)  # planned like a device with no status
    statuses = {"a": {"state": "offline", "release": "r1"}, "b": {"state": "unreadable", "message": "x"}}
    assert releases_before(["a", "b", "c"], statuses) == {"a": "r1", "b": None, "c": None}
    assert desired_serial(b"[" * 60000) is None and desired_serial(b'{"doc": 1}') is None


def test_desired_payload_carries_the_action(tmp_path: Path) -> None:
    key = generate_key("rollout")
    trust = rollout_trust(tmp_path)
    trust.replace([key.public])
    payload = desired_payload(
        "rollout", "cam-01", "", "r0", "rollback-x", 0, 3, health=DesiredHealth(), action="rollback"
    )
    doc = verify_desired(payload, "cam-01", trust, None)
    assert doc is not None and (doc.action, doc.release, doc.ref) == ("rollback", "r0", "")
    from edgedeploy.remote.mqtt import desired_serial

    assert desired_serial(payload) == 3


def test_a_status_of_a_device_with_several_models_is_read_per_model() -> None:
    """A status is about one model slot (`model`, none: default) and names every slot's release (`models`): the
    planner and the rollback read the release of the slot they address, never another slot's."""
    from edgedeploy.pull_api import releases_before

    st = {"state": "committed", "release": "c2", "model": "cam2", "models": {"default": "d1", "cam2": "c2"}}
    about_cam2, about_default = status_facts(st, "cam2"), status_facts(st)
    assert not isinstance(about_cam2, str) and not isinstance(about_default, str)
    assert (about_cam2.current_release, about_cam2.healthy_release) == ("c2", "c2")
    assert (about_default.current_release, about_default.healthy_release) == ("d1", None)
    old = {"state": "committed", "release": "d1"}  # a device with one model, or an agent from before slots
    assert releases_before(["a", "b"], {"a": st, "b": old}, "cam2") == {"a": "c2", "b": None}
    assert releases_before(["a", "b"], {"a": st, "b": old}) == {"a": "d1", "b": "d1"}


def test_a_models_own_status_is_read_with_the_devices_offline_or_unreadable_status() -> None:
    """A slot's own retained status (its topic) is what the planner reads about it; the device's last will is on
    the device's topic only, so a device offline is read as offline in every slot (with the slot's release),
    an unreadable one as unreadable; a slot never addressed over MQTT is read from the device's `models`."""
    device = {"state": "committed", "release": "d1", "models": {"default": "d1", "cam2": "c1"}}
    cam2 = {"state": "committed", "release": "c2", "model": "cam2", "serial": 4}
    statuses = {"a": device, "a/cam2": cam2, "b": device}
    assert slot_status(statuses, "a") == device and slot_status(statuses, "a", "cam2") == cam2
    assert slot_status(statuses, "b", "cam2") == device  # no own status: the device's names its release
    facts = status_facts(slot_status(statuses, "b", "cam2"), "cam2")
    assert not isinstance(facts, str) and (facts.current_release, facts.healthy_release) == ("c1", None)
    statuses["a"] = {"state": "offline", "release": "d1"}
    st = slot_status(statuses, "a", "cam2")
    assert st == {**cam2, "state": "offline"}
    facts = status_facts(st, "cam2")
    assert not isinstance(facts, str) and (facts.running, facts.current_release) == (False, "c2")
    statuses["a"] = {"state": "unreadable", "message": "too deep"}
    assert isinstance(status_facts(slot_status(statuses, "a", "cam2"), "cam2"), str)
    assert slot_status({}, "a", "cam2") is None
