"""A Jetson-like arm64 device on an x86 machine: a Debian bullseye arm64 root (glibc 2.31, Python 3.9,
systemd 247) under QEMU user-mode emulation, booted with systemd-nspawn (systemd as PID 1) and reached over
real SSH. The recipes are ../shared/reference/emulation.md's.

The prepared root is cached on disk, keyed by its recipe (`recipe_key`), so later runs reuse it; each run
boots an overlay on top of it, so the cached root itself is never changed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "EDGEDEPLOY_REQUIRE_ARM64_SYSTEMD"
CACHE_ENV = "EDGEDEPLOY_ARM64_ROOT_CACHE"
DEFAULT_CACHE = Path("/var/cache/edgedeploy-tests/arm64")
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
VENV = "/opt/edgedeploy/venv"
LOGIN = "deploy"  # the non-root deploying login
UNIT = "edgedeploy-agent.service"
FRAMES = "/srv/frames/frames.avi"  # the clip the device plays
CPUINFO = REPO / "tests" / "agent" / "fixtures" / "cpuinfo-carmel.txt"  # an AGX Xavier's
TVM_WHEEL = ("apache-tvm==0.27.0.post1", "manylinux_2_28_aarch64")  # its tvm/lib/libtvm_runtime.so (glibc 2.27)
PACKAGES = [
    *("systemd", "systemd-sysv", "dbus", "openssh-server", "iproute2", "procps", "sudo"),
    *("python3.9", "python3-venv", "python3-pip", "ca-certificates"),
]
RECIPE_REVISION = 1  # bump when `_build` changes what it makes
CLEAN_ENV = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]


def agent_requirements() -> list[str]:
    """The agent's dependencies, as the agent wheel declares them (its [agent] extra)."""
    with open(REPO / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"]["agent"])


def recipe() -> dict[str, object]:
    return {
        "revision": RECIPE_REVISION,
        "suite": "bullseye",
        "mirror": "http://deb.debian.org/debian",
        "packages": PACKAGES,
        "venv": VENV,
        "requirements": agent_requirements(),
        "tvm_wheel": TVM_WHEEL,
        "login": LOGIN,
    }


def recipe_key() -> str:
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, str(DEFAULT_CACHE)))


def missing() -> str | None:
    """Why the arm64 container cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, overlay mounts, systemd-nspawn)"
    tools = {
        "debootstrap": "debootstrap",
        "systemd-nspawn": "systemd-container",
        "socat": "socat",
        "nsenter": "util-linux",
        "aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu",
    }
    lacking = [pkg for tool, pkg in tools.items() if shutil.which(tool) is None]
    if lacking:
        return f"missing packages: apt-get install {' '.join(sorted(set(lacking)))}"
    if not BINFMT.is_file() or "enabled" not in BINFMT.read_text():
        return "no qemu-aarch64 binfmt handler: apt-get install qemu-user-static; containers/arm64-emulation.sh"
    flags = next((ln.split(":", 1)[1].strip() for ln in BINFMT.read_text().splitlines() if ln.startswith("flags:")), "")
    if "F" not in flags or "C" not in flags:
        return (
            f"qemu-aarch64 binfmt flags are {flags!r}: sudo in the root needs F and C (containers/arm64-emulation.sh)"
        )
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay file system"
    return None


@dataclass(frozen=True)
class PreparedRoot:
    root: Path  # the cached root (read-only lower layer)
    runtime_lib: Path  # aarch64 libtvm_runtime.so for `agent install --runtime-lib`
    timings: dict[str, float]


def _timed(timings: dict[str, float], name: str, fn: Callable[[], object]) -> None:
    t = time.monotonic()
    fn()
    timings[name] = round(time.monotonic() - t, 1)


def _run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


def _build(out: Path, log: Path) -> dict[str, float]:
    root, timings = out / "root", {}
    r = recipe()
    with open(log, "ab") as f:
        debootstrap = ["debootstrap", "--arch=arm64", "--variant=minbase", f"--include={','.join(PACKAGES)}"]
        _timed(
            timings,
            "debootstrap_s",
            lambda: _run([*debootstrap, r["suite"], str(root), r["mirror"]], stdout=f, stderr=f),
        )
        for unit in ("systemd-networkd.service", "systemd-networkd.socket"):  # netlink fails under qemu-user
            (root / "etc/systemd/system" / unit).symlink_to("/dev/null")
        (root / "var/log/journal").mkdir(exist_ok=True)  # a persistent journal, as on JetPack
        # the agent's dependencies, from PyPI (with this machine's CA file: the network here re-signs TLS);
        # `agent install` then finds them installed and needs no index (the container has no network)
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "tmp/host-ca.crt")
        chroot = ["chroot", str(root), *CLEAN_ENV, "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_CERT=/tmp/host-ca.crt"]
        pip = [*chroot, f"{VENV}/bin/pip", "install", "-q"]

        def venv() -> None:
            _run([*chroot, "python3.9", "-m", "venv", VENV], stdout=f, stderr=f)
            _run([*pip, "--upgrade", "pip"], stdout=f, stderr=f)
            _run([*pip, "--only-binary=:all:", *agent_requirements()], stdout=f, stderr=f)

        _timed(timings, "venv_s", venv)
        (root / "tmp/host-ca.crt").unlink()
        _run(["chroot", str(root), *CLEAN_ENV, "useradd", "--create-home", "--shell", "/bin/bash", LOGIN])

        def runtime() -> None:
            spec, platform = TVM_WHEEL
            wheels = out / "wheels"
            pip_download = [sys.executable, "-m", "pip", "download", "-q", spec, "--no-deps", "--only-binary=:all:"]
            _run([*pip_download, "--platform", platform, "--python-version", "3.10", "-d", str(wheels)], stdout=f)
            (wheel,) = wheels.glob("apache_tvm-*.whl")
            with zipfile.ZipFile(wheel) as z:
                (out / "libtvm_runtime.so").write_bytes(z.read("tvm/lib/libtvm_runtime.so"))
            shutil.rmtree(wheels)

        _timed(timings, "tvm_runtime_s", runtime)
    return timings


def prepare_root(log: Path) -> PreparedRoot:
    """The cached root for this recipe, built first if there is none (about 10 minutes)."""
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    done = base / recipe_key()
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a second run waits and reuses it
        if not (done / "recipe.json").is_file():
            partial = base / f"{recipe_key()}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            timings = _build(partial, log)
            (partial / "timings.json").write_text(json.dumps(timings))
            (partial / "recipe.json").write_text(json.dumps(recipe(), sort_keys=True, indent=1))
            partial.rename(done)
    timings = json.loads((done / "timings.json").read_text())
    return PreparedRoot(done / "root", done / "libtvm_runtime.so", timings)


def _cgroup_leftovers() -> list[Path]:
    """nspawn's payload/supervisor cgroups under this process's own cgroups (v1 name=systemd and v2)."""
    out = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controller, path = line.split(":", 2)
        hierarchy = {"name=systemd": "systemd", "": "unified"}.get(controller)
        if hierarchy is not None:
            out += [Path("/sys/fs/cgroup", hierarchy, path.lstrip("/"), d) for d in ("payload", "supervisor")]
    return out


def remove_cgroup_leftovers() -> None:
    """Empty cgroup folders a finished nspawn leaves behind make the next boot fail (emulation.md)."""
    for top in _cgroup_leftovers():
        if top.is_dir():
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                d.rmdir()
            top.rmdir()


@dataclass
class Container:
    """The cached root booted as a container: overlay, systemd-nspawn --boot, SSH forwarded to `port`."""

    lower: Path
    work: Path  # overlay upper/work folders and logs (kept between boots: the device's disk)
    port: int
    binds: list[str] = field(default_factory=list)  # extra --bind-ro=SRC:DST
    name: str = "edgedeploy-arm64"
    boots: list[float] = field(default_factory=list)  # seconds from nspawn start to a running system
    _nspawn: subprocess.Popen[bytes] | None = None
    _forward: subprocess.Popen[bytes] | None = None
    _inward: list[subprocess.Popen[bytes]] = field(default_factory=list)
    leader: int = 0  # the container's PID 1, as this machine sees it

    @property
    def merged(self) -> Path:
        return self.work / "merged"

    def mount(self) -> None:
        for d in ("upper", "ovl-work", "merged"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        opts = f"lowerdir={self.lower},upperdir={self.work / 'upper'},workdir={self.work / 'ovl-work'}"
        _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.merged)])

    def boot(self, timeout: float = 180) -> None:
        Path("/run/systemd/nspawn").mkdir(parents=True, exist_ok=True)
        if subprocess.run(["mountpoint", "-q", "/run/systemd/nspawn"]).returncode != 0:
            _run(["mount", "-t", "tmpfs", "tmpfs", "/run/systemd/nspawn"])
        remove_cgroup_leftovers()
        argv = ["systemd-nspawn", "-D", str(self.merged), "--boot", "--private-network", "--register=no"]
        argv += ["--keep-unit", f"--machine={self.name}", "--console=pipe", *(f"--bind-ro={b}" for b in self.binds)]
        t0 = time.monotonic()
        with open(self.work / "console.log", "ab") as log:  # the container's console (nspawn keeps its copy)
            self._nspawn = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self._nspawn.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self._nspawn.returncode}: see {self.work / 'console.log'}")
            children = Path(f"/proc/{self._nspawn.pid}/task/{self._nspawn.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            if pids:
                self.leader = int(pids[0])
                state = self.exec(["systemctl", "is-system-running"], check=False).stdout.strip()
                if state in ("running", "degraded"):
                    break
            time.sleep(0.5)
        else:
            raise TimeoutError(f"the container did not boot in {timeout} s: see {self.work / 'console.log'}")
        self.boots.append(round(time.monotonic() - t0, 1))
        inner = f"EXEC:nsenter -t {self.leader} -n socat STDIO TCP\\:127.0.0.1\\:22"
        listen = f"TCP-LISTEN:{self.port},bind=127.0.0.1,reuseaddr,fork"
        self._forward = subprocess.Popen(["socat", listen, inner], stdin=subprocess.DEVNULL)
        time.sleep(0.3)

    def forward_in(self, port: int) -> None:
        """The container's 127.0.0.1:`port` reaches this machine's 127.0.0.1:`port` (a server the test runs
        here, such as the broker): socat in the container's network namespace, each connection entering this
        process's namespace again. Until the next power-off."""
        back = f"EXEC:nsenter -t {os.getpid()} -n socat STDIO TCP\\:127.0.0.1\\:{port}"
        listen = f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"
        argv = ["nsenter", "-t", str(self.leader), "-n", "socat", listen, back]
        self._inward.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))

    def exec(self, argv: list[str], check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a command as root inside the container (all its namespaces)."""
        p = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", *CLEAN_ENV, *argv],
            capture_output=True,
            encoding="utf-8",  # systemctl's bullets and the journal's text, whatever this process's locale
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in the container: exit {p.returncode}: {p.stderr.strip()}")
        return p

    def poweroff(self, timeout: float = 120) -> None:
        for proc in self._inward:
            proc.terminate()
            proc.wait(10)
        self._inward.clear()
        if self._forward is not None:
            self._forward.terminate()
            self._forward.wait(10)
            self._forward = None
        if self._nspawn is not None and self._nspawn.poll() is None:
            self.exec(["systemctl", "poweroff"], check=False)
            try:
                self._nspawn.wait(timeout)
            except subprocess.TimeoutExpired:
                self._nspawn.send_signal(signal.SIGKILL)
                self._nspawn.wait(10)
        self._nspawn = None
        remove_cgroup_leftovers()

    def close(self) -> None:
        self.poweroff()
        subprocess.run(["umount", str(self.merged)], check=False)


EMULATED_CPUINFO_UNIT = """[Unit]
Description=Show the agent an AGX Xavier's /proc/cpuinfo (qemu-user 7.2 shows the x86 host's)
DefaultDependencies=no
Before=ssh.service edgedeploy-agent.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount --bind /etc/edgedeploy-emulation/cpuinfo /proc/cpuinfo

[Install]
WantedBy=multi-user.target
"""
# the unit's ProtectProc= gives it a fresh /proc: the same file over its /proc/cpuinfo; nothing else is changed
EMULATED_CPUINFO_DROPIN = "[Service]\nBindReadOnlyPaths=/etc/edgedeploy-emulation/cpuinfo:/proc/cpuinfo\n"


def set_up_disk(merged: Path, public_key: str, frames: Path) -> None:
    """What a technician did before `agent install`: a login with a key and a bootstrap sudo grant."""
    (merged / "etc/hostname").write_text("xavier-emu\n")
    # what L4T writes (JetPack 5.1): the installer takes it for a Jetson, which gets the CUDA backend
    (merged / "etc/nv_tegra_release").write_text("# R35 (release), REVISION: 2.1, GCID: 32413640, BOARD: t186ref\n")
    (merged / "etc/hosts").write_text("127.0.0.1 localhost\n127.0.1.1 xavier-emu\n")
    entry = next(ln.split(":") for ln in (merged / "etc/passwd").read_text().splitlines() if ln.startswith(f"{LOGIN}:"))
    uid, gid = int(entry[2]), int(entry[3])
    ssh = merged / "home" / LOGIN / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(public_key)
    for p in (ssh, ssh / "authorized_keys"):
        os.chown(p, uid, gid)
    (merged / "etc/sudoers.d/00-bootstrap").write_text(f"{LOGIN} ALL=(ALL) NOPASSWD: ALL\n")
    (merged / "etc/sudoers.d/00-bootstrap").chmod(0o440)
    emu = merged / "etc/edgedeploy-emulation"
    emu.mkdir(exist_ok=True)
    (emu / "cpuinfo").write_text(CPUINFO.read_text())
    systemd = merged / "etc/systemd/system"
    (systemd / "emulated-cpuinfo.service").write_text(EMULATED_CPUINFO_UNIT)
    (systemd / "multi-user.target.wants").mkdir(exist_ok=True)
    (systemd / "multi-user.target.wants/emulated-cpuinfo.service").symlink_to("../emulated-cpuinfo.service")
    # the watch service deploys too (pull rollouts); the template's drop-in is every model slot's instance's
    for unit in (UNIT, "edgedeploy-agent-watch.service", "edgedeploy-agent@.service"):
        (systemd / f"{unit}.d").mkdir(exist_ok=True)
        (systemd / f"{unit}.d/emulated-cpuinfo.conf").write_text(EMULATED_CPUINFO_DROPIN)
    (merged / "srv/frames").mkdir(parents=True, exist_ok=True)
    (merged / FRAMES.lstrip("/")).write_bytes(frames.read_bytes())
