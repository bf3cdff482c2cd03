"""Two models on one device over SSH (`push/rollback/status --model`): each in its own agent process with its own
source, health check and rollback; and a device from before model slots upgraded in place by a push."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgedeploy.publish import publish
from edgedeploy.remote.mqtt import Controller, MqttSettings, desired_payload
from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.desired import TERMINAL, DesiredHealth, slot_key
from edgedeploy_agent.heartbeat import pid_alive
from tests.agent.doubles import lay_out_as_before_slots
from tests.helpers import Cli, agent, assert_one_line_error
from tests.integration.conftest import Enrolled
from tests.integration.netfleet import padded_bundle
from tests.integration.pullfleet import PUBLISHER, PullFleet, signed

pytestmark = pytest.mark.integration


def _slot(dev: Enrolled, slot: str) -> Path:
    return dev.root / "models" / slot


def _serving(dev: Enrolled, slot: str) -> tuple[str, int]:
    return _serving_root(dev.root, slot)


def _serving_root(root: Path, slot: str) -> tuple[str, int]:
    """(release, pid) of the agent that serves `slot`, read from the device's disk; it must be alive and ready."""
    run = root / "models" / slot / "run"
    health = json.loads((run / "health.json").read_text())
    pid = int((run / "agent.pid").read_text())
    assert health["state"] == "ready" and health["pid"] == pid and pid_alive(pid), health
    return health["release"], pid


@pytest.fixture
def two_models(looping: Enrolled) -> Iterator[Enrolled]:
    yield looping
    agent("--root", str(looping.root), "--json", "stop", "--model", "cam2")  # (the fixture stops default)


@pytest.mark.sshd
def test_two_models_pushed_health_checked_and_rolled_back_independently(
    cli: Cli, two_models: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    dev = two_models
    clip = json.loads(agent("--root", str(dev.root), "--json", "facts").out)["source"]
    with open(dev.inventory, "a", encoding="utf-8") as f:  # the second model watches its own camera
        f.write(f'\n[devices.{dev.name}.models.cam2]\nsource = "{clip}"\n')
    v1 = read_manifest(mnist_bundle).release_name
    v2_bundle = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 4096, version="2")
    v2 = read_manifest(v2_bundle).release_name

    for model in ("default", "cam2"):
        r = cli("push", dev.name, str(mnist_bundle), "--model", model, "--min-inferences", "5", "--json", *dev.args())
        assert r.code == 0, r.err
        out = json.loads(r.out)
        assert out["outcome"] == "committed" and out["model"] == model and out["health"]["inferences"] >= 5
    (a_release, a_pid), (b_release, b_pid) = _serving(dev, "default"), _serving(dev, "cam2")
    assert a_release == b_release == v1 and a_pid != b_pid  # two agent processes, one per model

    # a bad push to cam2 (its health objective missed) rolls cam2 back; default serves on, never restarted
    r = cli("push", dev.name, str(v2_bundle), "--model", "cam2", "--max-p95-ms", "0.000001", *dev.args())
    assert_one_line_error(r, 4, "above the objective")
    assert "rolled back" in r.err and f"back on {v1}" in r.err
    assert _serving(dev, "default") == (v1, a_pid)
    assert _serving(dev, "cam2")[0] == v1

    # v2 into cam2 by a rollout, then a manual rollback of cam2 only
    r = cli("rollout", str(v2_bundle), "--devices", dev.name, "--model", "cam2", "--json", *dev.args())
    assert r.code == 0 and json.loads(r.out)["devices"][dev.name]["release_after"] == v2, r.out + r.err
    assert _serving(dev, "cam2")[0] == v2 and _serving(dev, "default") == (v1, a_pid)
    r = cli("rollback", dev.name, "--model", "cam2", *dev.args())
    assert r.code == 0 and f"{dev.name} model cam2: rolled back to {v1} (was {v2})" in r.out, r.out + r.err
    assert _serving(dev, "cam2")[0] == v1 and _serving(dev, "default") == (v1, a_pid)
    history = json.loads((_slot(dev, "default") / "state.json").read_text())["history"]
    assert [h["event"] for h in history] == ["committed"]  # nothing that happened to cam2 touched default

    # status: every model in one answer, and each model's own reports
    r = cli("status", dev.name, *dev.args())
    assert r.code == 0, r.err
    assert f"model default: {v1}, agent ready" in r.out and f"model cam2: {v1}, agent ready" in r.out, r.out
    r = cli("status", dev.name, "--model", "cam2", "--json", *dev.args())
    facts = json.loads(r.out)["facts"]
    assert facts["model"] == "cam2" and facts["current_release"] == v1 and set(facts["models"]) == {"default", "cam2"}
    r = cli("status", "--json", *dev.args())  # the fleet: each model's newest report
    latest = json.loads(r.out)["devices"][dev.name]["latest_by_model"]
    assert r.code == 0 and {m: x["slot"] for m, x in latest.items()} == {"default": "default", "cam2": "cam2"}
    for model, expected in (("cam2", {"cam2"}), ("cam9", set())):  # --model keeps that model's reports only
        r = cli("status", "--json", "--model", model, *dev.args())
        entry = json.loads(r.out)["devices"][dev.name]
        assert r.code == 0 and set(entry["latest_by_model"]) == expected and entry["has_model"] == bool(expected)
        assert (entry["latest"] or {}).get("slot") == (model if expected else None), entry
    r = cli("status", *dev.args())  # the fleet table: a row per model
    assert r.code == 0 and f"{dev.name}/cam2" in r.out and r.out.count(v1) == 2, r.out
    r = cli("status", "--model", "cam9", *dev.args())
    assert r.code == 0 and "NO MODEL" in r.out and v1 not in r.out, r.out
    r = cli("rollback", dev.name, "--model", "cam9", *dev.args())
    assert_one_line_error(r, 4, "has no model 'cam9' (models: default, cam2)")
    r = cli("push", dev.name, str(v2_bundle), "--model", "../x", *dev.args())
    assert_one_line_error(r, 2, "--model '../x' is not a model name")

    # logs and verify of one model: cam2's own log file and its own release, health and source
    own = (dev.root / "logs" / "agent-cam2.log").read_text().splitlines()
    r = cli("logs", dev.name, "--model", "cam2", "-n", "5", *dev.args())
    assert r.code == 0 and r.out.splitlines() == own[-5:], r.out + r.err
    assert r.out != cli("logs", dev.name, "-n", "5", *dev.args()).out  # the default model's log is another
    r = cli("verify", dev.name, "--model", "cam2", "--json", *dev.args())
    assert r.code == 0, r.out + r.err
    checks = {c["name"]: c for c in json.loads(r.out)["checks"]}
    assert checks["health"]["status"] == "ok" and checks["service"]["status"] == "ok", checks
    assert agent("--root", str(dev.root), "--json", "stop", "--model", "cam2").code == 0
    r = cli("verify", dev.name, "--model", "cam2", "--json", *dev.args())
    checks = {c["name"]: c for c in json.loads(r.out)["checks"]}
    assert checks["service"]["status"] != "ok" and "stopped" in checks["service"]["detail"], checks
    r = cli("verify", dev.name, "--json", *dev.args())  # the default model serves on
    checks = {c["name"]: c for c in json.loads(r.out)["checks"]}
    assert r.code == 0 and checks["service"]["status"] == "ok", checks
    for command in ("logs", "verify"):
        assert_one_line_error(cli(command, dev.name, "--model", "cam9", *dev.args()), 4, "has no model 'cam9'")
        assert_one_line_error(cli(command, dev.name, "--model", "Cam2", *dev.args()), 2, "is not a model name")


@pytest.mark.sshd
def test_a_device_from_before_model_slots_is_upgraded_in_place_by_a_push(
    cli: Cli, looping: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    """The device ran v1 in the layout from before slots (its release and state at the top of the root); the next
    push moves them into models/default, deploys v2 with v1 as its previous, and a rollback brings v1 back."""
    dev = looping
    v1 = read_manifest(mnist_bundle).release_name
    assert cli("push", dev.name, str(mnist_bundle), *dev.args()).code == 0
    agent("--root", str(dev.root), "--json", "stop")
    lay_out_as_before_slots(dev.root)
    assert os.readlink(dev.root / "current") == f"releases/{v1}" and not (dev.root / "models").exists()

    v2_bundle = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 4096, version="2")
    r = cli("push", dev.name, str(v2_bundle), "--json", *dev.args())
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["outcome"] == "committed" and out["previous"] == v1
    assert not any((dev.root / n).exists() for n in ("releases", "current", "state.json"))
    r = cli("rollback", dev.name, *dev.args())
    assert r.code == 0 and f"rolled back to {v1}" in r.out, r.out + r.err
    assert _serving(dev, "default")[0] == v1
    events = [h["event"] for h in json.loads((_slot(dev, "default") / "state.json").read_text())["history"]]
    assert events == ["committed", "committed", "manual-rollback"]  # the history from before slots is kept


@pytest.mark.fleet_servers
def test_a_pull_rollout_and_rollback_address_one_model(
    cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, tmp_path: Path
) -> None:
    """`rollout --via mqtt --model cam2`: the desired state names the slot, the device's watch deploys into it
    and its status says so; `rollback --via mqtt --model cam2` undoes that model's newest pull rollout. The
    default model, deployed by its own pull rollout before, is never touched."""
    fleet = pull_fleet
    dev = fleet.devices["dev1"]
    clip = json.loads(agent("--root", str(dev.root), "--json", "facts").out)["source"]
    assert agent("--root", str(dev.root), "init", "--model", "cam2", "--source", clip).code == 0
    first, second = (signed(cli, mnist_bundle, tmp_path / f"{n}.edb") for n in ("first", "second"))
    registry = f"{fleet.origin.address}/models/mnist"
    env = {"EDGEDEPLOY_REGISTRY_PASSWORD": PUBLISHER[1]}
    for b in (first, second):
        assert cli("publish", str(b), "--registry", registry, "--user", PUBLISHER[0], env=env).code == 0
    r1, r2 = read_manifest(first).release_name, read_manifest(second).release_name
    fleet.start("dev1")

    def rollout(bundle: Path, *model: str) -> None:
        r = cli("rollout", str(bundle), "--devices", "dev1", "--via", "mqtt", "--json", *model, *fleet.args(),
                timeout=240)  # fmt: skip
        assert r.code == 0, r.out + r.err + dev.log()
        assert json.loads(r.out)["devices"]["dev1"]["status"] == "committed", r.out

    rollout(first)
    default_before = _health(dev.root, "default")
    rollout(first, "--model", "cam2")
    rollout(second, "--model", "cam2")
    assert _health(dev.root, "cam2")[0] == r2 and _health(dev.root, "default") == default_before
    status = json.loads(cli("status", "dev1", "--via", "mqtt", "--model", "cam2", "--json", *fleet.args()).out)
    st = status["devices"]["dev1"]
    assert st["model"] == "cam2" and st["release"] == r2 and st["models"] == {"default": r1, "cam2": r2}, st
    st = json.loads(cli("status", "dev1", "--via", "mqtt", "--json", *fleet.args()).out)["devices"]["dev1"]
    assert st.get("model", "default") == "default" and st["release"] == r1 and st["models"]["cam2"] == r2, st

    r = cli("rollback", "dev1", "--via", "mqtt", "--model", "cam2", "--json", *fleet.args(), timeout=240)
    assert r.code == 0, r.out + r.err + dev.log()
    assert json.loads(r.out)["succeeded"]["dev1"]["outcome"] == "rolled-back"
    assert _health(dev.root, "cam2")[0] == r1 and _health(dev.root, "default") == default_before
    events = [h["event"] for h in json.loads((dev.root / "models" / "default" / "state.json").read_text())["history"]]
    assert events == ["committed"]


def _health(root: Path, slot: str) -> tuple[str, int]:
    """(release, pid) a slot's agent reports, healthy (this fleet's clip plays once: `finished` once it ended)."""
    health = json.loads((root / "models" / slot / "run" / "health.json").read_text())
    assert health["state"] in ("ready", "finished"), health
    return health["release"], health["pid"]


@pytest.mark.fleet_servers
def test_two_models_rolled_out_over_mqtt_while_the_device_was_away_both_converge(
    cli: Cli, pull_fleet: PullFleet, mnist_bundle: Path, tmp_path: Path, hermetic: Path
) -> None:
    """Desired state is retained per model slot (a topic each): documents for two slots of one device, published
    while its watch is down, are both on the broker when it comes back, and it deploys each into its slot (with
    one retained document per device the second replaced the first). A document about one slot published on
    another slot's topic is refused and changes nothing."""
    fleet = pull_fleet
    dev = fleet.devices["dev1"]
    clip = json.loads(agent("--root", str(dev.root), "--json", "facts").out)["source"]
    assert agent("--root", str(dev.root), "init", "--model", "cam2", "--source", clip).code == 0
    bundles = [signed(cli, mnist_bundle, tmp_path / f"{n}.edb") for n in ("first", "second")]
    refs = [
        publish(b, f"{fleet.origin.address}/models/mnist", user=PUBLISHER[0], password=PUBLISHER[1]).ref
        for b in bundles
    ]
    releases = [read_manifest(b).release_name for b in bundles]
    settings = MqttSettings(
        broker=fleet.broker.controller_address, password_file=str(hermetic / "config" / "mqtt-controller")
    )
    health = DesiredHealth(timeout_s=60)
    slots = (("default", refs[0], releases[0]), ("cam2", refs[1], releases[1]))
    with Controller(settings, client_id="test-controller") as c:
        serials = {}
        for model, ref, release in slots:
            key = slot_key("dev1", model)
            serials[key] = c.next_serial(key)
            payload = desired_payload(
                "rollout-1", "dev1", ref, release, f"r-{model}", 0, serials[key], health=health, model=model
            )
            c.publish_desired(key, payload)
        fleet.start("dev1")
        for model, _, release in slots:
            key = slot_key("dev1", model)
            st = c.wait_status(
                key, lambda st, k=key: st.get("serial") == serials[k] and st.get("state") in TERMINAL, 240
            )
            assert (st.get("state"), st.get("release"), st.get("model", "default")) == ("committed", release, model), (
                st,
                dev.log(),
            )
        assert _health(dev.root, "default")[0] == releases[0] and _health(dev.root, "cam2")[0] == releases[1]

        # cam2's document on the default slot's topic: refused there, neither slot changes
        serial = c.next_serial("dev1")
        c.publish_desired(
            "dev1",
            desired_payload("rollout-1", "dev1", refs[0], releases[0], "wrong", 0, serial, health=health, model="cam2"),
        )
        st = c.wait_status("dev1", lambda st: st.get("serial") == serial and st.get("state") in TERMINAL, 60)
        assert st.get("state") == "refused" and "on the topic of model default" in st.get("message", ""), st
    assert _health(dev.root, "default")[0] == releases[0] and _health(dev.root, "cam2")[0] == releases[1]
