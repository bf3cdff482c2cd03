"""MetaSchedule tuning and the stored databases: trials go where the time is, every stored record agrees
with the default schedule, builds apply the databases (the manifest names the kernels that came from one),
and `edgedeploy tune` measures through a real TVM RPC tracker and server on loopback, or exports, tunes
offline and imports."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edgedeploy.api import build, evaluate
from edgedeploy.build_store import host_file
from edgedeploy.compile.cards import ModelCard, load_card
from edgedeploy.compile.frontends.onnx_model import load_onnx
from edgedeploy.compile.int8.build import Int8Config
from edgedeploy.compile.int8.datasets import load_calibration
from edgedeploy.compile.int8.quantize import QuantizeOptions
from edgedeploy.compile.tuning.apply import (
    database_dir,
    drop_slower_than_default,
    has_database,
    tuning_module,
    tuning_target,
    verify_database,
)
from edgedeploy.compile.tuning.common import allocate_trials
from edgedeploy.compile.tuning.key import tuning_key
from edgedeploy.compile.tuning.metaschedule import open_database, tunable_tasks
from edgedeploy.profiles import get_profile
from edgedeploy_agent.bundle import Preprocess, cpu_flags, extract_bundle, read_manifest
from edgedeploy_agent.runtime import load_runtime
from edgedeploy_agent.runtime.tvm import TvmRuntime
from tests.helpers import Cli, assert_one_line_error, require
from tests.leftovers import stop_tree

REPO = Path(__file__).resolve().parents[2]
CARD = ModelCard(name="mnist", labels=[str(i) for i in range(10)], preprocess=Preprocess(color="gray"))


@pytest.fixture
def mnist_bundle(data_dir: Path, tmp_path: Path) -> Path:
    return build(data_dir / "models" / "mnist-8_opset13.onnx", "cpu-x86_64", tmp_path / "m.edb", CARD).bundle


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def rpc_device(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A TVM RPC tracker and one RPC server registered with key "edgetest", as on a device."""
    port = _free_port()
    log, tracker_log = tmp_path / "rpc-server.log", tmp_path / "rpc-tracker.log"
    py = sys.executable
    with open(tracker_log, "w") as out:
        tracker = subprocess.Popen(
            [py, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = None
    server_port = _free_port()
    try:
        # the tracker imports tvm, then serves from a popen_worker that imports it again: 12 s on the idle 2-core
        # machine, past 60 s once with a second test run beside it
        deadline = time.monotonic() + 240
        while not _listening(port):
            assert time.monotonic() < deadline and tracker.poll() is None, f"RPC tracker: {tracker_log.read_text()}"
            time.sleep(0.2)
        with open(log, "w") as out:
            server = subprocess.Popen(
                [py, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(server_port),
                 "--port-end", str(server_port + 1), "--tracker", f"127.0.0.1:{port}", "--key", "edgetest"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        from tvm import rpc

        while rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"].get("edgetest", {}).get("free", 0) < 1:
            assert time.monotonic() < deadline and server.poll() is None, log.read_text()
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", log
    finally:
        for p in (server, tracker):
            if p is not None:
                stop_tree(p)  # each serves from a popen_worker child that terminate() alone would orphan


def _records(db: Path) -> list[float]:
    return [float(r.run_secs[0]) for r in open_database(db).get_all_tuning_records() if r.run_secs]


@pytest.mark.compile
def test_rpc_tuning_measures_on_the_device_and_builds_apply_it(
    mnist_bundle: Path, data_dir: Path, tmp_path: Path, cli: Cli, rpc_device: tuple[str, Path], hermetic: Path
) -> None:
    tracker, server_log = rpc_device
    r = cli("tune", str(mnist_bundle), "--trials", "2", "--tasks", "1", "--cost-model", "random",
            "--tracker", tracker, "--key", "edgetest", "--json", timeout=600)  # fmt: skip
    assert r.code == 0, r.err
    out = json.loads(r.out)
    db = Path(out["database"])
    assert db.is_relative_to(hermetic / "config" / "tuning" / "cpu-x86_64")  # the user's database
    assert out["key"].endswith("-fp32") and (out["kernels_from_database"], out["kernels"]) == (1, 10)
    times = _records(db)
    assert len(times) == 2 and all(0 < t < 1 for t in times), times  # measured, not the 1e10 failure mark
    assert server_log.read_text().count("load_module") >= 2  # the device loaded the candidates it timed

    # the next build of the same model applies the database, and the tuned kernel computes the same
    tuned = build(data_dir / "models" / "mnist-8_opset13.onnx", "cpu-x86_64", tmp_path / "t.edb", CARD)
    assert tuned.manifest.provenance.options["tuning"].startswith(f"cpu-x86_64/{db.name}: 1/10 kernels: ")
    x = np.random.default_rng(0).uniform(0, 255, (1, 1, 28, 28)).astype(np.float32)
    outs = []
    for bundle in (mnist_bundle, tuned.bundle):
        rel = tmp_path / bundle.stem
        extract_bundle(bundle, rel)
        outs.append(load_runtime(rel, read_manifest(bundle)).run([x])[0])
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-3)


@pytest.mark.compile
def test_offline_tuning_export_tune_import(mnist_bundle: Path, tmp_path: Path, cli: Cli, hermetic: Path) -> None:
    export = tmp_path / "export"
    r = cli("tune", str(mnist_bundle), "--export", str(export))
    assert r.code == 0, r.err
    meta = json.loads((export / "tuning.json").read_text())
    assert (meta["profile"], meta["tasks"]) == ("cpu-x86_64", 8)
    # the weights stay home: the export holds the kernels, with zeros where the model's constants were
    # (TVM stores tensor constants as long base64 runs; mnist-8's weights alone would make runs of ~700)
    assert not re.findall(r"[A-Za-z0-9+/=]{200,}", (export / "tuning-module.json").read_text())
    p = subprocess.run(
        [sys.executable, "-m", "edgedeploy.compile.tune_offline", str(export), "--trials", "2", "--tasks", "1",
         "--cost-model", "random"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "2 records" in p.stdout
    with (export / "database_tuning_record.json").open("a") as f:
        f.write('{"torn": ')  # a run stopped mid-write
    r = cli("tune", "--import", str(export), "--json")
    assert r.code == 0, r.err
    stored = json.loads(r.out)
    assert stored["records"] == 2
    assert Path(stored["database"]) == hermetic / "config" / "tuning" / "cpu-x86_64" / meta["key"]
    assert all(0 < t < 1 for t in _records(Path(stored["database"])))


@pytest.mark.compile
def test_tune_refuses_what_it_cannot_measure(mnist_bundle: Path, tmp_path: Path, cli: Cli) -> None:
    assert_one_line_error(cli("tune", str(mnist_bundle), "--tracker", "127.0.0.1:9190"), contains="--key")
    assert_one_line_error(cli("tune", str(mnist_bundle), "--tracker", "nohost", "--key", "k"), contains="HOST:PORT")
    assert_one_line_error(cli("tune", str(mnist_bundle), "--trials", "0"), contains="--trials")
    assert_one_line_error(cli("tune", "--import", str(tmp_path)), contains="no tuned database")
    assert_one_line_error(cli("tune", str(tmp_path / "missing.edb")), contains="missing.edb")
    assert_one_line_error(cli("tune"), contains="name a bundle")


def _two_kernel_database(bundle: Path, tmp_path: Path) -> tuple[Any, Any, Path, dict[str, Any], str, str]:
    """A real database with one record for each of two kernels of the MNIST model."""
    import onnx
    import tvm
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from edgedeploy.profiles import get_profile

    m = read_manifest(bundle)
    extract_bundle(bundle, tmp_path / "rel")
    proto = onnx.load(host_file(m, "onnx-model", tmp_path / "rel"))
    target = tuning_target(get_profile("cpu-x86_64"))
    with target:
        mod = tuning_module(from_onnx(proto, shape_dict={m.inputs[0].name: m.inputs[0].shape}))
        tasks = {t.task_name: t for t in tunable_tasks(mod, target)}
    slow, fast = sorted(tasks)[:2]
    db = tmp_path / "db"
    db.mkdir()
    database = open_database(db)
    for name in (slow, fast):
        workload = database.commit_workload(tasks[name].dispatched[0])
        trace = Schedule(tasks[name].dispatched[0]).trace
        database.commit_tuning_record(ms.database.TuningRecord(trace, workload, [tvm.runtime.convert(1e-5)], target))
    return mod, target, db, tasks, slow, fast


@pytest.mark.compile
def test_verification_keeps_a_reordered_long_sum_and_drops_a_wrong_schedule(tmp_path: Path) -> None:
    """A float32 sum of 4,608 products (ResNet-18's longest) in 16 partial sums (rfactor) differs from the
    default schedule's sequential sum by more than a per-element 1e-4 tolerance near zero, and is kept; a
    schedule that rounds the sum to float16 before the bias is added is dropped."""
    from types import SimpleNamespace

    import tvm
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from edgedeploy.profiles import get_profile

    a, b = te.placeholder((64, 4608), "float32", name="a"), te.placeholder((4608, 64), "float32", name="b")
    bias, r = te.placeholder((64,), "float32", name="bias"), te.reduce_axis((0, 4608), "r")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    d = te.compute((64, 64), lambda i, j: c[i, j] + bias[j], name="d")
    workload = tvm.IRModule({"main": te.create_prim_func([a, b, bias, d])})
    target = tuning_target(get_profile("cpu-x86_64"))

    def reordered(sch: Any) -> None:
        *_, k = sch.get_loops(sch.get_sblock("c"))
        sch.rfactor(sch.split(k, [None, 16])[1], 0)

    def float16(sch: Any) -> None:
        sch.unsafe_set_dtype(sch.get_sblock("c"), 0, "float16")

    for name, schedule in (("reordered", reordered), ("float16", float16)):
        db = tmp_path / name
        db.mkdir()
        database = open_database(db)
        sch = Schedule(workload)
        schedule(sch)
        record = ms.database.TuningRecord(
            sch.trace, database.commit_workload(workload), [tvm.runtime.convert(1e-5)], target
        )
        database.commit_tuning_record(record)
        dropped = verify_database(db, [SimpleNamespace(task_name=name, dispatched=[workload])], target)
        kept = len(open_database(db).get_all_tuning_records())
        assert (dropped, kept) == (([], 1) if name == "reordered" else ([name], 0))


def test_records_not_faster_than_the_default_are_dropped(mnist_bundle: Path, tmp_path: Path) -> None:
    """The model timings say one tuned kernel is slower than its default schedule (timings are injected:
    a test must not depend on a machine's speed)."""
    import tvm_ffi

    mod, target, db, tasks, slow, fast = _two_kernel_database(mnist_bundle, tmp_path)
    measured: list[Path | None] = []

    def measure(mod: object, target: object, with_db: Path | None) -> dict[str, float]:
        measured.append(with_db)
        return {slow: 2.0, fast: 0.5} if with_db else {slow: 1.0, fast: 1.0}

    assert drop_slower_than_default(mod, target, db, tasks, measure) == [slow]
    assert measured == [db, None]
    left = [r.workload.mod for r in open_database(db).get_all_tuning_records()]
    assert len(left) == 1 and tvm_ffi.structural_equal(left[0], tasks[fast].dispatched[0])


def test_an_interrupted_rewrite_leaves_the_database_whole(
    mnist_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the database is rewritten (here: as its first new record is made) loses no record."""
    from tvm.s_tir import meta_schedule as ms

    mod, target, db, tasks, slow, fast = _two_kernel_database(mnist_bundle, tmp_path)
    before = {f: (db / f).read_bytes() for f in ("database_workload.json", "database_tuning_record.json")}

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ms.database, "TuningRecord", interrupted)
    with pytest.raises(KeyboardInterrupt):
        drop_slower_than_default(
            mod, target, db, tasks, lambda m, t, d: {slow: 2.0, fast: 0.5} if d else {slow: 1.0, fast: 1.0}
        )
    assert {f: (db / f).read_bytes() for f in before} == before
    assert sorted(p.name for p in db.iterdir()) == sorted(before)  # no temp folder left behind
    assert len(open_database(db).get_all_tuning_records()) == 2


def test_a_rewrite_killed_after_its_commit_point_is_completed_by_the_next_reader(tmp_path: Path) -> None:
    """Killed between the two renames (the workloads moved in, the records not): the next reader finishes
    the swap; killed before the commit point: the half-written new files are dropped, the old ones kept."""
    workloads, records = "database_workload.json", "database_tuning_record.json"
    db = tmp_path / "db"
    (db / ".rewrite-ready").mkdir(parents=True)
    (db / workloads).write_text("new workloads\n")  # already moved in
    (db / records).write_text("old records\n")
    (db / ".rewrite-ready" / records).write_text("new records\n")
    (db / ".rewrite-abc").mkdir()  # the work folder of a rewrite killed before its commit point
    assert has_database(db)
    assert (db / records).read_text() == "new records\n" and sorted(p.name for p in db.iterdir()) == [
        records,
        workloads,
    ]


# --- the stored databases (profiles/tuning) ---

MNV1_CARD = REPO / "examples" / "cards" / "mobilenet_v1_0.25_224.toml"


def test_trials_follow_measured_time() -> None:
    costs = {"big": 4.6, "mid": 1.2, "small": 0.5, "tiny": 0.05}
    plan = allocate_trials(costs, 160)
    assert list(plan) == ["big", "mid", "small"]  # most expensive first; under 2 % of the time gets none
    assert plan["big"] > plan["mid"] > plan["small"] >= 8
    assert sum(plan.values()) <= 160 and all(n % 8 == 0 for n in plan.values())
    assert allocate_trials(costs, 8) == {"big": 8}
    assert allocate_trials({}, 100) == {} and allocate_trials(costs, 0) == {}


def _database(model: Path, precision: str, profile: str = "cpu-x86_64") -> Path:
    db = database_dir(profile, tuning_key(load_onnx(model), precision), REPO / "profiles" / "tuning")
    assert has_database(db), f"no stored {precision} database for {model.name} at {db} (profiles/tuning is committed)"
    return db


@pytest.mark.compile
def test_tuned_fp32_bundle_uses_the_database_and_matches_onnxruntime(data_dir: Path, tmp_path: Path) -> None:
    model = data_dir / "models" / "mobilenet_v1_0.25_224.onnx"
    db = _database(model, "fp32")
    card = load_card(MNV1_CARD)
    res = build(model, "cpu-x86_64", tmp_path / "f.edb", card)
    tuning = res.manifest.provenance.options["tuning"]
    assert tuning.startswith(f"cpu-x86_64/{db.name}: ") and "fused_conv2d" in tuning
    assert res.manifest.target.cpu_features and "avx2" in res.manifest.target.cpu_features
    m = extract_bundle(res.bundle, tmp_path / "rel")
    tvm_rt = TvmRuntime(tmp_path / "rel", m)
    sess = ort.InferenceSession(str(host_file(m, "onnx-model", tmp_path / "rel")))
    x = load_calibration(data_dir / "imagenet-sample", card.preprocess, m.inputs[0], 8, "evaluation")
    for i in range(len(x)):
        got = np.asarray(tvm_rt.run([x[i : i + 1]])[0])
        want = sess.run(None, {m.inputs[0].name: x[i : i + 1]})[0]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    # an input that is not 64-byte aligned (AVX2 code faulted on one before the runtime realigned it)
    raw = np.empty(x[:1].nbytes + 128, dtype=np.uint8)
    start = -raw.ctypes.data % 64 + 4
    odd = raw[start : start + x[:1].nbytes].view(np.float32).reshape(x[:1].shape)
    odd[...] = x[:1]
    assert odd.ctypes.data % 64 == 4
    np.testing.assert_array_equal(np.asarray(tvm_rt.run([odd])[0]), np.asarray(tvm_rt.run([x[:1]])[0]))


@pytest.mark.compile
def test_resnet18_fp32_bundle_computes_what_onnxruntime_computes(tmp_path: Path) -> None:
    """bench/resnet18_onnx.py's export (bench/int8_cpu.py's ResNet-18): every convolution takes the cpu-direct-conv
    kernel, so no tuning database is needed (the first one, 6 tuned kernels, matched none of them any more and
    was deleted); the bundle computes what onnxruntime computes."""
    sys.path.insert(0, str(REPO / "bench"))
    from resnet18_onnx import export

    model = tmp_path / "resnet18.onnx"
    export(model, seed=0, tiled=True)
    res = build(model, "cpu-x86_64", tmp_path / "r.edb", ModelCard(name="resnet18"))
    assert "tuning" not in res.manifest.provenance.options
    m = extract_bundle(res.bundle, tmp_path / "rel")
    x = np.random.default_rng(0).uniform(-2, 2, (1, 3, 224, 224)).astype(np.float32)
    got = np.asarray(TvmRuntime(tmp_path / "rel", m).run([x])[0])
    want = ort.InferenceSession(str(model)).run(None, {m.inputs[0].name: x})[0]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.compile
@pytest.mark.parametrize("profile", ["cpu-x86_64", "cpu-x86_64-v4"])
def test_int8_bundle_agrees_with_the_reference(data_dir: Path, tmp_path: Path, profile: str) -> None:
    """The default quantization on the whole evaluation half, each x86 profile (v4: AVX-512 code and the VNNI
    kernels, where this CPU runs them). Every convolution is a hand-scheduled kernel (the depthwise-separable
    chain, docs/int8.md), so no kernel takes a schedule from a database: the INT8 databases were deleted."""
    needs = get_profile(profile).compiler.cpu_features
    lacks = sorted(set(needs) - (cpu_flags() or frozenset()))
    require("CPU_AVX512_VNNI", f"this CPU lacks {', '.join(lacks)}" if lacks else None)
    model = data_dir / "models" / "mobilenet_v1_0.25_224.onnx"
    images = data_dir / "imagenet-sample"
    cfg = Int8Config(calibration=images, eval_data=images, options=QuantizeOptions())
    res = build(model, profile, tmp_path / "i.edb", load_card(MNV1_CARD), int8=cfg)
    assert "conv2d" not in read_manifest(res.bundle).provenance.options.get("tuning", "")
    ev = evaluate(res.bundle, images, load_card(MNV1_CARD))
    assert ev["split"] == "evaluation" and ev["images"] == 230
    # Not 100 %: the bundle requantizes with a float32 multiplier, the exact reference in exact arithmetic, and
    # MobileNetV1-0.25 amplifies the rare one-step differences (measured 96.1 % on these 230 images). A wrong
    # schedule (the stale database of an earlier session) gave 81.7 %.
    assert ev["top1_agreement_bundle_vs_int8_reference"] >= 93.0
    assert abs(ev["tvm_bundle"]["top1"] - ev["int8_reference"]["top1"]) <= 2.5


@pytest.mark.compile
def test_tuning_an_int8_bundle_compiles_its_qdq_model_under_the_source_key(
    data_dir: Path, tmp_path: Path, cli: Cli, hermetic: Path
) -> None:
    """The build looks its database up by the source model's graph; `tune` of the INT8 bundle compiles the Q/DQ
    model but must write under that same key, or the next build would never find what it tuned."""
    model = data_dir / "models" / "mnist-8_opset13.onnx"
    res = build(model, "cpu-x86_64", tmp_path / "q.edb", CARD, int8=Int8Config(calibration=data_dir / "mnist"))
    r = cli("tune", str(res.bundle), "--export", str(tmp_path / "e"), "--json")
    assert r.code == 0, r.err
    meta = json.loads((tmp_path / "e" / "tuning.json").read_text())
    assert meta["key"] == json.loads(r.out)["key"] == tuning_key(load_onnx(model), "int8")
    assert "int8" in (tmp_path / "e" / "tuning-module.json").read_text()  # the Q/DQ model's kernels
