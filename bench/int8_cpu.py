"""CPU latency, in one run and on the same inputs: TVM FP32 and INT8 bundles against onnxruntime FP32 and INT8.

    python bench/int8_cpu.py [--model mobilenet|resnet18|mnist|all] [--runs 50] [--threads N] [--tvm-spin N]
                             [--profile cpu-x86_64 [--profile cpu-x86_64-v4]] [--data ../shared/data]

The default, `all`, measures MobileNetV1-0.25 and ResNet-18 (bench/resnet18_onnx.py's deterministic export,
written to a temporary folder; it finds the same build cache and tuning databases every time). The bundles
are built (or taken from the build cache) exactly like `edgedeploy build`, so a stored tuning database under
profiles/tuning/<profile>/ is applied when there is one; the TVM libraries run through the agent's runtime, as
on a device. onnxruntime runs the bundle's own FP32 source and QDQ model (from the host's build store, where
the build put them): it is the peer a user would pick, measured for speed only. Its INT8 outputs are not a
reference (its integer kernels depend on the CPU; compile/int8/qdq_reference.py is the exact INT8 reference).

Like with like: TVM's thread pool (TVM_NUM_THREADS) and onnxruntime's intra-op pool get the same thread
count (--threads, default: every CPU of this machine); --tvm-spin sets how long TVM's idle workers spin before
they sleep (TVM_THREAD_POOL_SPIN_COUNT; docs/int8.md: on an oversubscribed host 0 made TVM's medians 20-30x
lower). The peers run interleaved, one call each per round (with several threads, BLOCK calls in a row, the
first WARM not counted: each runtime's idle workers spin after a call and would take a core from the next peer), so a
noisy neighbour slows them alike; min and median per peer. The closing lines are the ratios the project's goal
is stated in: TVM INT8 speed-up over TVM FP32, and TVM best / onnxruntime best (medians), to three decimals
with met / missed from the unrounded ratio; the latter's goal is per CPU, so it has a verdict for this CPU's own
profile only (the one built for the most of its features: an AVX2 bundle on an AVX-512 CPU runs against
onnxruntime's AVX-512 kernels, which no user of an AVX2 CPU gets; --cpu avx2 measures that comparison).

Profiles: by default every x86-64 CPU profile whose cpu_features this machine's /proc/cpuinfo lists
(built-in: cpu-x86_64, AVX2; cpu-x86_64-v4, AVX-512 with VNNI, where the CPU has it), each with its own bundles and
tuning databases; all their TVM bundles and the two onnxruntime peers run in the same interleaved rounds, and
the ratios are printed per profile.

--cpu avx2 measures as on an AVX2-only x86-64 CPU (the project's AMD EPYC machines) on a machine whose CPU also
has AVX-512: bench/avx2_only.c, preloaded, hides AVX-512 and VNNI from cpuid, so onnxruntime (and numpy) take
their AVX2 kernels, and only the AVX2 profile's bundles run. Same cores, so it is a stand-in: it says which
kernels win on AVX2, not what an EPYC's clock gives.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgedeploy.api import build
from edgedeploy.build_store import host_file
from edgedeploy.compile.cards import ModelCard
from edgedeploy.compile.int8.build import Int8Config
from edgedeploy.compile.int8.datasets import load_calibration
from edgedeploy.compile.int8.quantize import QuantizeOptions
from edgedeploy.compile.package import load_card
from edgedeploy.profiles import all_profiles, get_profile
from edgedeploy_agent.bundle import cpu_flags, extract_bundle
from edgedeploy_agent.runtime.tvm import TvmRuntime, unpin_thread_pool

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import avx2_only  # noqa: E402
from resnet18_onnx import export as export_resnet18  # noqa: E402


@dataclass(frozen=True)
class Model:
    file: str  # under <data>/models, or written by bench/resnet18_onnx.py ("resnet18.onnx")
    data: str  # calibration images, under <data>
    card: str  # under examples/cards/, or "" for RESNET18_CARD


MODELS = {
    "mobilenet": Model("mobilenet_v1_0.25_224.onnx", "imagenet-sample", "mobilenet_v1_0.25_224.toml"),
    "resnet18": Model("resnet18.onnx", "imagenet-sample", ""),
    "mnist": Model("mnist-8_opset13.onnx", "mnist", "mnist-8.toml"),
}
# torchvision's preprocessing, as bench/gpu_kit.sh builds ResNet-18 bundles
RESNET18_CARD = {
    "name": "resnet18",
    "preprocess": {
        "color": "rgb",
        "resize": "center_crop",
        "crop_fraction": 0.875,
        "mean": [123.675, 116.28, 103.53],
        "std": [58.395, 57.12, 57.375],
    },
}
BLOCK, WARM = 20, 5  # calls per peer and round with several threads, the first WARM not counted (see interleaved_ms)
ORT_PEERS = ("onnxruntime FP32", "onnxruntime INT8 (QDQ)")


Peer = Callable[[np.ndarray], object]


def interleaved_ms(peers: dict[str, Peer], inputs: np.ndarray, runs: int, block: int = 1) -> dict[str, list[float]]:
    """Milliseconds per call of each peer, `runs` rounds, each peer `block` calls in a row per round on the same
    input; with a block of more than one, its first WARM calls are not counted. With several threads each runtime's
    idle workers spin for a while after a call (onnxruntime's intra-op pool and TVM's both do by default), so a
    peer called right after another one starts with a core taken: MobileNet's AVX2 INT8 bundle at two threads took
    1.03 ms (min) called between onnxruntime's calls, 0.53 ms alone. Blocks of 4 with one uncounted were not
    enough and flattered us (onnxruntime suffers TVM's spinning more than the reverse: its FP32 1.06 ms min there,
    0.59 alone); blocks of 20 with 5 uncounted give what each peer gives alone (TVM INT8 0.53-0.54 ms, onnxruntime
    FP32 0.60-0.61 ms, MobileNet as AVX2, two threads)."""
    for fn in peers.values():
        for x in inputs[:3]:
            fn(x[None])
    times: dict[str, list[float]] = {k: [] for k in peers}
    for i in range(runs):
        x = inputs[i % len(inputs)][None]
        for k, fn in peers.items():
            for j in range(block):
                t = time.perf_counter()
                fn(x)
                if j >= WARM or block == 1:
                    times[k].append((time.perf_counter() - t) * 1000)
    return times


def model_source(name: str, data: Path, work: Path) -> tuple[Path, ModelCard, Int8Config]:
    """The model file, its card and the INT8 calibration this bench builds `name` with (ResNet-18 exported into
    `work`): the same bundles, and build cache entries, for every bench that calls it."""
    spec = MODELS[name]
    if spec.card:
        model, card = data / "models" / spec.file, load_card(REPO / "examples" / "cards" / spec.card)
    else:
        model, card = work / spec.file, ModelCard.model_validate(RESNET18_CARD)
        export_resnet18(model, seed=0, tiled=True)
    return model, card, Int8Config(calibration=data / spec.data, options=QuantizeOptions())


def measure(name: str, args: argparse.Namespace, work: Path) -> None:
    spec = MODELS[name]
    model, card, cfg = model_source(name, args.data, work)
    peers: dict[str, Peer] = {}
    manifests = {}
    for profile in args.profile:
        t = time.perf_counter()
        fp32 = build(model, profile, work / f"{name}.{profile}.fp32.edb", card)
        int8 = build(model, profile, work / f"{name}.{profile}.int8.edb", card, int8=cfg)
        cached = f"cached: fp32 {fp32.cached}, int8 {int8.cached}"
        print(f"{spec.file} for {profile}: bundles ready in {time.perf_counter() - t:.1f} s ({cached})")
        for label, res in (("FP32", fp32), ("INT8", int8)):
            rel = work / f"{name}.{profile}.{label}"
            m = extract_bundle(res.bundle, rel)
            runtime = TvmRuntime(rel, m)
            peers[f"TVM {label} {profile}"] = lambda x, r=runtime: r.run([x])
            manifests[(profile, label)] = (m, rel)
    mf, rel_f = manifests[(args.profile[0], "FP32")]
    mi, rel_i = manifests[(args.profile[0], "INT8")]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = args.threads
    ort_f = ort.InferenceSession(str(host_file(mf, "onnx-model", rel_f)), so, providers=["CPUExecutionProvider"])
    ort_i = ort.InferenceSession(str(host_file(mi, "qdq-onnx", rel_i)), so, providers=["CPUExecutionProvider"])
    inp = mf.inputs[0].name
    peers[ORT_PEERS[0]] = lambda x: ort_f.run(None, {inp: x})
    peers[ORT_PEERS[1]] = lambda x: ort_i.run(None, {inp: x})
    inputs = load_calibration(args.data / spec.data, card.preprocess, mf.inputs[0], 16, "evaluation")
    runs = args.runs
    block = 1 if args.threads == 1 else BLOCK  # one thread: no idle workers spinning between the peers' calls
    print_agreement(peers, inputs)
    times = interleaved_ms(peers, inputs, runs, block)
    calls = f"{block - WARM} counted calls after {WARM} uncounted" if block > 1 else "one call"
    print(f"{spec.file}, batch 1, {runs} interleaved rounds of {calls} per peer, {args.threads} threads each")
    for (profile, label), (m, _) in manifests.items():
        db, _, names = m.provenance.options.get("tuning", "").partition(": ")
        used = f"{len(names.split(', '))} kernels from {db}" if names else "none (default schedules)"
        print(f"  {label} bundle for {profile}, kernels from a tuning database: {used}")
    med = {k: statistics.median(v) for k, v in times.items()}
    width = max(len(k) for k in times)
    print(f"  {'':{width}s} {'min':>9s}    {'median':>9s}")
    for k, v in times.items():
        print(f"  {k:{width}s} {min(v):9.3f} ms {med[k]:9.3f} ms")
    ort_f_ms, ort_i_ms = med[ORT_PEERS[0]], med[ORT_PEERS[1]]
    ort_best = min(ort_f_ms, ort_i_ms)
    print(f"  onnxruntime INT8 speed-up over its FP32:  {ort_f_ms / ort_i_ms:7.3f}x")
    own = own_profile(args.profile)
    for profile in args.profile:
        f, i = med[f"TVM FP32 {profile}"], med[f"TVM INT8 {profile}"]
        print(f"  {profile}:")
        print(f"    TVM INT8 speed-up over TVM FP32:        {f / i:7.3f}x  (goal >= 1.5: {_met(f / i >= 1.5)})")
        print(f"    TVM FP32 / onnxruntime FP32 latency:    {f / ort_f_ms:7.3f}x")
        print(f"    TVM INT8 / onnxruntime INT8 latency:    {i / ort_i_ms:7.3f}x")
        best = min(f, i) / ort_best
        # the goal is per CPU: its own profile's bundles against onnxruntime on it (which takes this CPU's widest
        # kernels); an older CPU's profile here is no user's choice (--cpu avx2 measures it as on its own CPU)
        verdict = f"goal <= 1.0: {_met(best <= 1.0)}" if profile == own else f"this CPU's profile is {own}: no goal"
        print(f"    TVM best / onnxruntime best latency:    {best:7.3f}x  ({verdict})")
        # the same by the minimums: a noisy neighbour inflates one peer's median more than another's (two threads on
        # a shared 2-core machine gave onnxruntime INT8 a 20.2 ms median against an 8.3 ms minimum)
        low = {k: min(v) for k, v in times.items()}
        best_low = min(low[f"TVM FP32 {profile}"], low[f"TVM INT8 {profile}"])
        print(f"      the same by the minimums:             {best_low / min(low[p] for p in ORT_PEERS):7.3f}x")


def _met(ok: bool) -> str:
    """A goal's verdict from the unrounded ratio (a 1.0014 printed as 1.00 once read as met)."""
    return "met" if ok else "missed"


def print_agreement(peers: dict[str, Peer], inputs: np.ndarray) -> None:
    """The second look at what is timed: each peer's top-1 on the same inputs against onnxruntime FP32's (a
    fast but wrong bundle shows here; INT8 peers agree less, by their quantization)."""

    def top1(fn: Peer) -> np.ndarray:
        return np.array([int(np.argmax(np.asarray(_first(fn(x[None]))))) for x in inputs])

    ref = top1(peers[ORT_PEERS[0]])
    shown = ", ".join(f"{k} {np.mean(top1(fn) == ref):.0%}" for k, fn in peers.items() if k != ORT_PEERS[0])
    print(f"  top-1 agreement with onnxruntime FP32 on the {len(inputs)} inputs: {shown}")


def _first(out: object) -> object:
    """The first output of a peer's call (TVM and onnxruntime both return a list)."""
    return out[0] if isinstance(out, list | tuple) else out


def host_profiles() -> list[str]:
    """The x86-64 CPU profiles whose cpu_features this machine has, by name (cpu-x86_64 first)."""
    have = cpu_flags() or frozenset()
    if os.environ.get(avx2_only.ACTIVE):  # bench/avx2_only.c hides these from cpuid
        have = frozenset(f for f in have if not avx2_only.hidden(f))
    return [
        name
        for name, p in sorted(all_profiles().items())
        if p.device == "cpu" and p.arch == "x86_64" and p.compiler.cpu_features and set(p.compiler.cpu_features) <= have
    ]


def own_profile(profiles: list[str]) -> str:
    """Of the measured profiles, the one built for the most of this CPU's features: what a user of this CPU deploys
    (cpu-x86_64-v4 on an AVX-512 VNNI CPU, cpu-x86_64 on an AVX2 one or under --cpu avx2)."""
    return max(profiles, key=lambda name: len(get_profile(name).compiler.cpu_features or ()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=[*sorted(MODELS), "all"], default="all")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--profile",
        action="append",
        help="a CPU profile whose target this machine runs (repeatable; default: every x86-64 one its CPU has)",
    )
    ap.add_argument("--cpu", choices=["native", "avx2"], default="native", help="avx2: as on an AVX2-only CPU")
    ap.add_argument("--tvm-spin", type=int, help="TVM_THREAD_POOL_SPIN_COUNT (TVM's default when not given)")
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data"))
    )
    args = ap.parse_args()
    if args.threads < 1 or args.runs < 1:
        raise SystemExit("--threads and --runs must be at least 1")
    if args.cpu == "avx2":
        reason = avx2_only.why_not()
        if reason:
            raise SystemExit(f"--cpu avx2: {reason}")
        avx2_only.rerun_preloaded(Path(tempfile.gettempdir()))
    args.profile = args.profile or host_profiles()
    if not args.profile:
        raise SystemExit("this machine's CPU has the features of no built-in x86-64 profile: name one with --profile")
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # read when TVM's thread pool starts: before any run
    if args.tvm_spin is not None:
        os.environ["TVM_THREAD_POOL_SPIN_COUNT"] = str(args.tvm_spin)
    spin = os.environ.get("TVM_THREAD_POOL_SPIN_COUNT", "TVM's default")
    logging.disable(logging.WARNING)
    ort.set_default_logger_severity(3)
    load = ", ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    for profile in args.profile:
        print(f"profile {profile}, target {dict(get_profile(profile).compiler.target)}")
    shown = "AVX2 only (bench/avx2_only.c: cpuid without AVX-512 and VNNI)" if args.cpu == "avx2" else "as it is"
    bind = unpin_thread_pool()  # as the agent runs TVM (it would when the first bundle loads; here it is printed)
    print(f"TVM pool spin count {spin}, TVM_BIND_THREADS={bind}; load average {load}; CPU {shown}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("mobilenet", "resnet18") if args.model == "all" else (args.model,):
            measure(name, args, Path(tmp))


if __name__ == "__main__":
    main()
