"""The pure planner and the agent-output parser: no I/O, captured agent output as input."""

import json
from pathlib import Path

import pytest

from edgedeploy.errors import DeviceError, InputError
from edgedeploy.inventory import Device
from edgedeploy.remote.agent_client import parse_agent_output
from edgedeploy.remote.blobs import Blob, BundleBlobs
from edgedeploy.remote.facts import parse_facts
from edgedeploy.remote.plan import HealthPolicy, plan_push
from edgedeploy.remote.transport import CommandResult
from edgedeploy_agent.bundle import HostFile, Manifest, read_manifest
from tests.agent.bundles import make_bundle
from tests.host.doubles import FACTS

DEV = Device(name="d1", host="h", profile="cpu-x86_64")
LIB = Blob("a" * 64, 1000, "model.so", Path("/cache/blobs") / ("a" * 64))
ALL = {LIB.sha256}  # what the device lacks


def blobs_of(manifest: Manifest) -> BundleBlobs:
    return BundleBlobs(manifest, "m" * 64, None, (LIB,))


@pytest.fixture
def manifest(tmp_path: Path):
    return read_manifest(make_bundle(tmp_path))


def test_parse_facts() -> None:
    f = parse_facts(FACTS)
    assert (f.arch, f.current_release, f.healthy_release, f.running) == ("x86_64", "toy-1-abc", "toy-1-abc", True)


def test_plan_upload_and_deploy(manifest) -> None:
    actions = plan_push(blobs_of(manifest), ALL, DEV, parse_facts(FACTS))
    assert [a.kind for a in actions] == ["upload", "deploy"] and not any(a.noop for a in actions)


def test_the_plan_carries_what_it_runs(manifest: Manifest) -> None:
    """The upload names each file and where it lands; the deploy holds the agent's whole command line."""
    upload, deploy = plan_push(blobs_of(manifest), ALL, DEV, parse_facts(FACTS), health=HealthPolicy(timeout=5))
    assert upload.puts == ((LIB.local, f"{DEV.root}/blobs/incoming/{LIB.sha256}"),) and not upload.argv
    assert deploy.argv == (
        DEV.agent_command, "--root", DEV.root, "--json", "deploy", "--manifest-blob", "m" * 64, "--timeout", "5",
    )  # fmt: skip
    assert deploy.timeout_s == HealthPolicy(timeout=5).deploy_timeout and not deploy.puts
    upload, _ = plan_push(blobs_of(manifest), set(), DEV, parse_facts(FACTS))
    assert upload.noop and not upload.puts


def test_plan_noop_when_already_running(manifest) -> None:
    facts = parse_facts(
        {
            **FACTS,
            "current": {"release": manifest.release_name},
            "health": {"release": manifest.release_name, "state": "ready"},
        }
    )
    assert all(a.noop for a in plan_push(blobs_of(manifest), ALL, DEV, facts))
    assert not any(a.noop for a in plan_push(blobs_of(manifest), ALL, DEV, facts, force=True))


def test_an_agent_of_schema_1_is_asked_to_upgrade_for_a_bundle_with_host_files(tmp_path: Path) -> None:
    """Schema 2 (host files named in the manifest) is refused before any upload by an agent that reads 1;
    a schema 1 bundle still goes to it."""
    new = read_manifest(make_bundle(tmp_path / "new"))
    old_agent = parse_facts({**FACTS, "bundle_schema": 1})
    with pytest.raises(DeviceError, match="reads bundle schema 1, bundle is schema 2") as e:
        plan_push(blobs_of(new), ALL, DEV, old_agent)
    assert e.value.code == "incompatible-bundle" and e.value.hint == "upgrade the agent"
    old = read_manifest(make_bundle(tmp_path / "old", schema_version=1))
    assert [a.kind for a in plan_push(blobs_of(old), ALL, DEV, old_agent)] == ["upload", "deploy"]


def test_an_agent_of_schema_2_is_asked_to_upgrade_for_a_tflite_or_pytorch_bundle(tmp_path: Path) -> None:
    """Bundles whose source is a TFLite model or a torch.export program are schema 3 (new host-file roles);
    an agent that reads 2 is refused before any upload, and still gets ONNX bundles (schema 2)."""
    src = HostFile(name="m.tflite", role="tflite-model", sha256="ab" * 32, size=3)
    new = read_manifest(make_bundle(tmp_path / "new", schema_version=3, host_files=[src]))
    agent_2 = parse_facts({**FACTS, "bundle_schema": 2})
    with pytest.raises(DeviceError, match="reads bundle schema 2, bundle is schema 3") as e:
        plan_push(blobs_of(new), ALL, DEV, agent_2)
    assert e.value.code == "incompatible-bundle"
    onnx = read_manifest(make_bundle(tmp_path / "onnx"))
    kinds = [a.kind for a in plan_push(blobs_of(onnx), ALL, DEV, agent_2)]
    assert onnx.schema_version == 2 and kinds == ["upload", "deploy"]


def test_plan_refusals(manifest) -> None:
    with pytest.raises(InputError, match="bundle is for profile cpu-x86_64, device d1 is t4"):
        plan_push(blobs_of(manifest), ALL, DEV.model_copy(update={"profile": "t4"}), parse_facts(FACTS))
    with pytest.raises(DeviceError, match="not enough disk: 10 MiB free") as e:
        plan_push(blobs_of(manifest), ALL, DEV, parse_facts({**FACTS, "free_bytes": 10 << 20}))
    assert e.value.code == "no-space"
    with pytest.raises(DeviceError, match="arch aarch64"):
        plan_push(blobs_of(manifest), ALL, DEV, parse_facts({**FACTS, "arch": "aarch64"}))
    with pytest.raises(DeviceError, match="not initialised"):
        plan_push(blobs_of(manifest), ALL, DEV, parse_facts({**FACTS, "initialised": False}))


def test_parse_agent_output() -> None:
    ok = CommandResult(("a",), 0, 'noise\n{"ok": true, "x": 1}\n', "")
    assert parse_agent_output(ok, "d")["x"] == 1
    err = CommandResult(
        ("a",), 3, '{"ok": false, "error": {"code": "bad-bundle", "message": "sha256 mismatch", "hint": null}}\n', ""
    )
    with pytest.raises(DeviceError, match="d: sha256 mismatch") as e:
        parse_agent_output(err, "d")
    assert e.value.code == "bad-bundle"
    missing = CommandResult(("a",), 127, "", "bash: edgedeploy-agent: command not found\n")
    with pytest.raises(DeviceError, match="not found on the device") as e:
        parse_agent_output(missing, "d")
    assert e.value.code == "agent-missing"


def test_an_interrupted_transition_is_never_a_noop(manifest: Manifest) -> None:
    """Facts that report a transition a crash left make the push deploy (which recovers first)."""
    running = {
        "current": {"release": manifest.release_name},
        "health": {"release": manifest.release_name, "state": "ready"},
    }
    facts = parse_facts({**FACTS, **running, "pending": {"state": "health-check", "release": "x"}})
    assert facts.pending_state == "health-check"
    assert not any(a.noop for a in plan_push(blobs_of(manifest), set(), DEV, facts)[1:])


def test_the_captured_facts_parse_and_a_renamed_key_is_refused() -> None:
    """tests/agent/fixtures/facts.json is a real agent's answer (kept current by test_facts_format.py)."""
    captured = json.loads((Path(__file__).parents[1] / "agent" / "fixtures" / "facts.json").read_text())
    f = parse_facts(captured, "cam-01")
    assert f.current_release and f.current_release.startswith("toy-1-") and f.health_state == "dead"
    renamed = {**{k: v for k, v in captured.items() if k != "arch"}, "machine": "x86_64"}
    with pytest.raises(DeviceError, match="cam-01: the agent's facts are not in the format") as e:
        parse_facts(renamed, "cam-01")
    assert e.value.code == "agent-mismatch"
