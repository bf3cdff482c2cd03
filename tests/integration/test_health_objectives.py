"""Health objectives on a real agent playing real video: N inferences, latency; a miss rolls back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import read_manifest
from tests.helpers import Cli, assert_one_line_error
from tests.integration.conftest import Enrolled
from tests.integration.netfleet import padded_bundle

pytestmark = pytest.mark.integration


def test_inferences_then_a_missed_latency_objective_rolls_back(
    cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    r = cli("push", device.name, str(mnist_bundle), "--min-inferences", "20", "--json", *device.args())
    assert r.code == 0, r.err
    health = json.loads(r.out)["health"]
    assert health["inferences"] >= 20 and health["infer_p95_ms"] > 0 and health["fps"] > 0, health

    v2 = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 4096, version="9")
    r = cli("push", device.name, str(v2), "--max-p95-ms", "0.000001", *device.args())
    assert_one_line_error(r, 4, "above the objective")
    assert "rolled back" in r.err
    assert (device.root / "models" / "default" / "current").resolve().name == read_manifest(mnist_bundle).release_name
    r = cli("push", device.name, str(v2), "--min-inferences", "100000", "--timeout", "60", *device.args())
    assert_one_line_error(r, 4, "source ended after")  # the 300-frame clip cannot give 100000 inferences


@pytest.mark.compile
def test_objectives_from_the_model_card_travel_in_the_bundle(
    cli: Cli, device: Enrolled, mnist_bundle: Path, data_dir: Path, tmp_path: Path
) -> None:
    card = tmp_path / "card.toml"
    card.write_text('name = "mnist"\nversion = "9"\n[preprocess]\ncolor = "gray"\n[health]\nmin_inferences = 1000\n')
    strict = tmp_path / "strict.edb"
    r = cli("build", str(data_dir / "models" / "mnist-8_opset13.onnx"), "--profile", "cpu-x86_64", "-o", str(strict),
            "--card", str(card))  # fmt: skip
    assert r.code == 0, r.err
    assert read_manifest(strict).health.min_inferences == 1000  # type: ignore[union-attr]
    assert cli("push", device.name, str(mnist_bundle), *device.args()).code == 0
    r = cli("push", device.name, str(strict), *device.args())
    assert_one_line_error(r, 4, "source ended after 300 inferences, 1000 required")
    assert (device.root / "models" / "default" / "current").resolve().name == read_manifest(mnist_bundle).release_name
