"""A device with several sources, as the host sees it: the inventory names them, a push and an enrolment pass
each one to the agent (argv words, recorded without sshd), and `status` shows the newest report of every source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from edgedeploy.cli.status import latest_per_source, show_report
from edgedeploy.inventory import Device, Inventory
from edgedeploy.remote.blobs import bundle_blobs
from edgedeploy.remote.execute import PushOptions, init_agent, push
from edgedeploy.remote.plan import HealthPolicy
from edgedeploy_agent.report import BatchReport, Report, stage_latency
from tests.agent.bundles import make_bundle, make_report
from tests.host.doubles import FACTS, RecordingTransport, agent_ok

SOURCES = ["v4l2:/dev/video0", "file:/data/lot b.mp4"]
DEV = Device(name="cam-01", host="10.0.0.5", profile="cpu-x86_64", sources=SOURCES, max_batch_wait_ms=5)


def test_the_inventory_keeps_several_sources_and_refuses_both_forms(tmp_path: Path) -> None:
    inv = Inventory.load(tmp_path / "devices.toml")
    inv.add(DEV)
    again = Inventory.load(tmp_path / "devices.toml").get("cam-01")
    assert again.sources == SOURCES and again.max_batch_wait_ms == 5 and again.source is None
    assert again.source_args() == ["--source", SOURCES[0], "--source", SOURCES[1], "--max-batch-wait-ms", "5"]
    assert Device(name="d", host="h", profile="t4", source="file:/a.mp4").source_args() == ["--source", "file:/a.mp4"]
    assert Device(name="d", host="h", profile="t4").source_args() == []
    inv.add(Device(name="one", host="h", profile="t4", source="file:/a.mp4"))
    assert "sources" not in (tmp_path / "devices.toml").read_text().split("[devices.one]")[1]
    with pytest.raises(ValidationError, match="not both"):
        Device(name="d", host="h", profile="t4", source="file:/a.mp4", sources=SOURCES)


def test_push_and_enrolment_pass_every_source(tmp_path: Path) -> None:
    blobs = bundle_blobs(make_bundle(tmp_path / "b", version="2"))
    t = RecordingTransport()
    t.on("facts", agent_ok(**{k: v for k, v in FACTS.items() if k != "ok"}, blobs=None))
    t.on("deploy", agent_ok(outcome="committed", release=blobs.manifest.release_name, previous=None, timings={}))
    t.on("init", agent_ok(root="/var/lib/edgedeploy", config={}))
    push(
        t,
        DEV,
        blobs,
        PushOptions(health=HealthPolicy(timeout=5)),
    )
    init_agent(t, DEV)
    deploy, init = [a for a in t.runs if a[4] in ("deploy", "init")]
    want = ("--source", SOURCES[0], "--source", SOURCES[1], "--max-batch-wait-ms", "5")
    assert deploy[-len(want) :] == want and init[-len(want) :] == want


def test_status_shows_the_newest_report_of_each_source(capsys: pytest.CaptureFixture[str]) -> None:
    batch = BatchReport(size=4, sources=2, max_wait_ms=5, mean_fill=1.8, aggregate_fps=61.5)
    lat = {"batch_wait": stage_latency([0.5]), "infer": stage_latency([3.0])}
    reports = [
        make_report(1, source="file:/old.mp4").model_dump(mode="json"),  # a source the agent served before
        *[
            make_report(
                seq,
                source=SOURCES[seq % 2],
                batch=batch,
                latency_ms=lat,
                frame_latency_ms=stage_latency([9.0]),
                model_gpu_ms=stage_latency([2.5]),
            ).model_dump(mode="json")
            for seq in range(2, 6)
        ],
    ]
    latest = latest_per_source(reports)
    assert [(r["seq"], r["source"]) for r in latest] == [(4, SOURCES[0]), (5, SOURCES[1])]
    assert latest_per_source(reports[:1]) == reports[:1] and latest_per_source([]) == []
    show_report("cam-01", latest[0])
    out = capsys.readouterr().out
    assert "of 61.5 for 2 sources, batch 4 (mean fill 1.8), frame latency p50/p99 9.0/9.0 ms" in out
    assert "batch_wait" in out and SOURCES[0] in out
    assert re.search(r"\(model on the GPU\)\W+2\.500\W+2\.500", out)  # beside the stages (report schema 3)


def test_a_report_from_before_several_sources_still_reads_and_shows(capsys: pytest.CaptureFixture[str]) -> None:
    old = make_report(7).model_dump(mode="json", exclude_none=True)
    for key in ("frame_latency_ms", "batch", "model_gpu_ms"):
        old.pop(key, None)
    old["schema_version"] = 1  # what a device's agent spooled before report schema 2
    assert Report.model_validate(old).batch is None
    assert latest_per_source([old]) == [old]
    show_report("cam-01", old)
    out = capsys.readouterr().out
    assert "1.0 FPS (busy time)" in out and "model on the GPU" not in out
