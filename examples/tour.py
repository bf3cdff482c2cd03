"""The newcomer tour of docs/tour.md, run from start to end on this machine, each step's wall time printed.

    .venv/bin/python examples/tour.py [--data ../shared/data] [--workdir DIR] [--no-pull]

Everything a step does is an `edgedeploy` or `edgedeploy-agent` command (printed before it runs), in a folder
of its own: the tour's keys, inventory, build store and devices live under DIR (default: a temporary folder,
removed at the end), never in your own configuration. The devices are local ones (`--transport local`): the
agent runs as a process on this machine. The pull pilot needs mosquitto and docker-registry (`apt-get install
mosquitto docker-registry`); without them the script stops with that line unless `--no-pull` is given.
Exit 0 when every step worked; otherwise the failing command's output and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL = "models/mobilenet_v1_0.25_224.onnx"
CARD = REPO / "examples" / "cards" / "mobilenet_v1_0.25_224.toml"


class StepFailed(Exception):
    pass


class Tour:
    def __init__(self, work: Path, data: Path) -> None:
        self.work, self.data = work, data
        self.times: list[tuple[str, float]] = []
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "EDGEDEPLOY_CONFIG_DIR": str(work / "config"),
            "EDGEDEPLOY_STATE_DIR": str(work / "state"),
            "EDGEDEPLOY_CACHE_DIR": str(work / "cache"),
            "EDGEDEPLOY_INVENTORY": str(work / "devices.toml"),
        }

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 900) -> str:
        print("  $", " ".join(argv), flush=True)
        p = subprocess.run(
            argv, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout, cwd=self.work
        )
        if p.returncode != 0:
            raise StepFailed(f"`{' '.join(argv)}` exited {p.returncode}:\n{p.stdout}{p.stderr}")
        return p.stdout

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        print(f"[{len(self.times) + 1}] {name}", flush=True)
        t = time.perf_counter()
        yield
        self.times.append((name, time.perf_counter() - t))
        print(f"    {name}: {self.times[-1][1]:.1f} s", flush=True)


def tour_steps(t: Tour, pull: bool) -> None:
    model, photos, video = t.data / MODEL, t.data / "imagenet-sample", t.data / "video" / "bikes.mp4"
    fp32, int8 = t.work / "mobilenet.edb", t.work / "mobilenet-int8.edb"
    with t.step("build: ONNX -> TVM -> bundle (cpu-x86_64)"):
        t.run("edgedeploy", "build", str(model), "-p", "cpu-x86_64", "--card", str(CARD), "-o", str(fp32))
        t.run("edgedeploy", "inspect", str(fp32))
    with t.step("eval: top-1 of the FP32 bundle on real photos"):
        print(t.run("edgedeploy", "eval", str(fp32), "--data", str(photos)), end="")
    with t.step("INT8: calibrate on one half of the photos, gate on the other"):
        t.run(
            "edgedeploy", "build", str(model), "-p", "cpu-x86_64", "--card", str(CARD), "--int8",
            "--calibration", str(photos), "--eval", str(photos), "--max-top1-drop", "2.0", "-o", str(int8),
        )  # fmt: skip
        print(t.run("edgedeploy", "eval", str(int8), "--data", str(photos), "--split", "evaluation"), end="")
    with t.step("a device: a signing key, add, enroll (a local agent process)"):
        t.run("edgedeploy", "keys", "generate", "fleet-1")  # enrolment pins it: the device takes signed bundles
        for bundle in (fp32, int8):
            t.run("edgedeploy", "sign", str(bundle), "--key", "fleet-1")
        t.run(
            "edgedeploy", "devices", "add", "cam-01", "--host", "localhost", "--transport", "local",
            "--root", str(t.work / "cam-01"), "--service", "process", "--profile", "cpu-x86_64",
            "--source", f"file:{video}", "--tags", "lab",
        )  # fmt: skip
        t.run("edgedeploy", "devices", "enroll", "cam-01")
    with t.step("push FP32, then INT8 (signed: verify, activate, health-check)"):
        print(t.run("edgedeploy", "push", "cam-01", str(fp32)), end="")
        print(t.run("edgedeploy", "push", "cam-01", str(int8)), end="")
    with t.step("status: the agent's reports"):
        time.sleep(2)  # a report or two from the running agent
        t.run("edgedeploy", "status", "cam-01")
    with t.step("verify: the on-device self-test"):
        t.run("edgedeploy", "verify", "cam-01")
    with t.step("logs: the agent's log"):
        t.run("edgedeploy", "logs", "cam-01", "--lines", "20")
    with t.step("rollback: back to the FP32 release"):
        print(t.run("edgedeploy", "rollback", "cam-01"), end="")
        t.run("edgedeploy-agent", "--root", str(t.work / "cam-01"), "stop")
    if pull:
        with t.step("pull pilot: fleet servers, publish, rollout --via mqtt"):
            pull_pilot(t, fp32, video)


def pull_pilot(t: Tour, bundle: Path, video: Path) -> None:
    """docs/fleet.md's pilot on one machine: init's servers as processes on loopback, a device that pulls."""
    from edgedeploy.fleet_servers import ServerProcess
    from edgedeploy.localdevice import free_port
    from edgedeploy.remote.install_pull import record_broker_user

    fleet = t.work / "fleet"
    names = ("mqtt", "controller", "origin", "readonly", "cache")
    ports = [a for n in names for a in (f"--{n}-port", str(free_port()))]
    user = ["--user", "mosquitto"] if os.geteuid() == 0 else []  # root: the servers run as mosquitto
    setup = json.loads(
        t.run("edgedeploy", "fleet-servers", "init", str(fleet), "--listen", "127.0.0.1", "--public-host", "127.0.0.1",
              *ports, *user, "--json")
    )  # fmt: skip
    servers = [ServerProcess(s["argv"], s["listen"], t.work / f"{s['name']}.log") for s in setup["servers"]]
    watch: subprocess.Popen[bytes] | None = None
    root = t.work / "pilot-01"
    try:
        for server in servers:
            server.start()
        t.run("edgedeploy", "keys", "generate", "rollout-1")
        t.run(
            "edgedeploy", "devices", "add", "pilot-01", "--host", "localhost", "--transport", "local",
            "--root", str(root), "--service", "process", "--profile", "cpu-x86_64", "--source", f"file:{video}",
        )  # fmt: skip
        t.run("edgedeploy", "devices", "enroll", "pilot-01")
        # the device's broker user, as `agent install --broker-passwd` adds it; the broker re-reads it on SIGHUP
        password = root / "mqtt-password"
        password.write_text(secrets.token_urlsafe(24))
        password.chmod(0o600)
        record_broker_user("pilot-01", password, Path(setup["broker_passwd"]))
        assert servers[0].proc is not None
        servers[0].proc.send_signal(signal.SIGHUP)
        keys = {k["name"]: k["public"] for k in json.loads(t.run("edgedeploy", "keys", "list", "--json"))}
        t.run(
            "edgedeploy-agent", "--root", str(root), "watch-config", "--broker", setup["device_broker"],
            "--registry", setup["device_registry"], "--password-file", str(password),
            "--rollout-key", keys["rollout-1"],
        )  # fmt: skip
        print("  $ edgedeploy-agent --root", root, "watch &", flush=True)
        with open(root / "watch.log", "ab") as log:
            watch = subprocess.Popen(
                ["edgedeploy-agent", "--root", str(root), "watch"],
                env=t.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        publisher = Path(setup["publisher_password_file"]).read_text().strip()
        t.run(
            "edgedeploy", "publish", str(bundle), "--registry", f"{setup['publish_registry']}/models/mobilenet",
            "--user", "publisher", env={"EDGEDEPLOY_REGISTRY_PASSWORD": publisher},
        )  # fmt: skip
        print(t.run("edgedeploy", "rollout", str(bundle), "--devices", "pilot-01", "--via", "mqtt"), end="")
        t.run("edgedeploy", "status", "pilot-01", "--via", "mqtt")
    finally:
        if watch is not None:
            watch.send_signal(signal.SIGTERM)
            watch.wait(15)
        subprocess.run(["edgedeploy-agent", "--root", str(root), "stop"], env=t.env, capture_output=True, check=False)
        for server in reversed(servers):
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data = os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data")
    ap.add_argument("--data", type=Path, default=Path(data), help="the shared data folder (EDGEDEPLOY_DATA)")
    ap.add_argument("--workdir", type=Path, help="keep everything here (default: a temporary folder, removed)")
    ap.add_argument("--no-pull", action="store_true", help="leave out the pull pilot (no mosquitto/docker-registry)")
    args = ap.parse_args()
    data = args.data.resolve()
    if not (data / MODEL).is_file():
        print(f"error: {data / MODEL} not found: give the shared data folder with --data DIR", file=sys.stderr)
        return 2
    from edgedeploy.errors import EdgeDeployError
    from edgedeploy.fleet_servers import servers_available

    missing = servers_available()
    if missing and not args.no_pull:
        print(f"error: the pull pilot needs the fleet servers, {missing} (or --no-pull)", file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="edgedeploy-tour-"))
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)  # the fleet servers' account (mosquitto, as root) must enter it
    tour = Tour(work.resolve(), data)
    try:
        tour_steps(tour, pull=not args.no_pull)
    except (StepFailed, EdgeDeployError) as e:  # a command's exit, or a fleet server that would not start
        print(f"tour failed: {e}", file=sys.stderr)
        return 1
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\nwall time per step:")
    for name, seconds in tour.times:
        print(f"  {seconds:7.1f} s  {name}")
    print(f"  {sum(s for _, s in tour.times):7.1f} s  in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
