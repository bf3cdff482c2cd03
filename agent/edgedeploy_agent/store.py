"""The device's on-disk store: releases, the atomic `current` link, persisted state, spool.

ROOT/agent.json           configuration
ROOT/state.json           current / previous releases, the pending transition, history
ROOT/incoming/            uploads land here (*.part while in flight)
ROOT/releases/<name>/     unpacked, verified bundles (never modified after the rename)
ROOT/current -> releases/<name>   swapped by rename(2): readers see old or new, never neither
ROOT/spool/               reports waiting for the host (spool/sent/ once acknowledged)
ROOT/run/                 pid file and health.json of the running agent
"""

import datetime as _dt
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from .bundle import MANIFEST_NAME, Manifest, extract_bundle, read_manifest, sha256_file, verify_bundle
from .config import CONFIG_HINT, AgentConfig, config_error
from .durable import atomic_folder, fsync_dir, write_json_atomic
from .errors import BundleError, InsufficientSpace, StateError

SPACE_MARGIN_BYTES = 16 << 20
HISTORY_LENGTH = 50


def check_free(folder: Path, needed: int) -> None:
    """`needed` bytes and SPACE_MARGIN_BYTES must fit in the free space under `folder` (InsufficientSpace)."""
    free = shutil.disk_usage(folder).free
    if free < needed + SPACE_MARGIN_BYTES:
        raise InsufficientSpace(
            f"device has {free // (1 << 20)} MiB free under {folder}, "
            f"needs {(needed + SPACE_MARGIN_BYTES) // (1 << 20)} MiB",
            hint="free space on the device or remove old releases",
        )


def utcnow() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


class DeviceStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.incoming = root / "incoming"
        self.releases = root / "releases"
        self.spool = root / "spool"
        self.run_dir = root / "run"
        self.logs = root / "logs"
        self.current_link = root / "current"
        self.config_path = root / "agent.json"
        self.state_path = root / "state.json"

    # --- setup ------------------------------------------------------------------------------
    def init(self, config: AgentConfig) -> None:
        for d in (self.root, self.incoming, self.releases, self.spool, self.spool / "sent", self.run_dir, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.config_path, config.model_dump(mode="json"))
        if not self.state_path.exists():
            write_json_atomic(self.state_path, self._empty_state())

    @property
    def initialised(self) -> bool:
        return self.config_path.is_file() and self.state_path.is_file()

    def require_initialised(self) -> None:
        if not self.initialised:
            raise StateError(
                f"{self.root} is not an initialised agent root",
                hint="run `edgedeploy devices enroll` (or `edgedeploy-agent init --root ...`) first",
            )

    def config(self) -> AgentConfig:
        self.require_initialised()
        try:
            return AgentConfig.model_validate_json(self.config_path.read_text(encoding="utf-8"))
        except ValidationError as e:
            raise StateError(f"{self.config_path} is invalid: {config_error(e)}", hint=CONFIG_HINT) from None

    def update_config(self, **changes: Any) -> AgentConfig:
        cfg = self.config().model_copy(update=changes)
        cfg = AgentConfig.model_validate(cfg.model_dump())
        write_json_atomic(self.config_path, cfg.model_dump(mode="json"))
        return cfg

    @contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """One deploy or rollback at a time on a device (two hosts, or two rollouts, may collide)."""
        self.root.mkdir(parents=True, exist_ok=True)
        # read-only: flock needs no write access, so the service user and a deploying login in its group share
        # the lock whoever created it (the unit's UMask=0027 leaves the group no write access)
        with open(os.open(self.root / ".lock", os.O_RDONLY | os.O_CREAT, 0o640), "rb") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StateError(
                    f"another deploy or rollback is running on this device; {what} refused",
                    hint="wait for it to finish, then try again",
                ) from None
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def busy(self) -> bool:
        """Whether a deploy, rollback or recovery holds `exclusive` now (probed with a shared lock)."""
        lock = self.root / ".lock"
        if not lock.exists():
            return False
        with open(lock) as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False

    # --- state ------------------------------------------------------------------------------
    @staticmethod
    def _empty_state() -> dict[str, Any]:
        return {"current": None, "previous": [], "pending": None, "history": []}

    def state(self) -> dict[str, Any]:
        self.require_initialised()
        try:
            data: dict[str, Any] = json.loads(self.state_path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise StateError(f"{self.state_path} is corrupt: {e}") from None
        return data

    def save_state(self, state: dict[str, Any]) -> None:
        state["history"] = state.get("history", [])[-HISTORY_LENGTH:]
        write_json_atomic(self.state_path, state)

    def record(self, state: dict[str, Any], event: str, release: Optional[str], detail: str = "") -> None:
        state.setdefault("history", []).append({"time": utcnow(), "event": event, "release": release, "detail": detail})

    # --- releases ---------------------------------------------------------------------------
    def current(self) -> Optional[str]:
        try:
            return Path(os.readlink(self.current_link)).name
        except FileNotFoundError:
            return None

    def release_dir(self, name: str) -> Path:
        return self.releases / name

    def check_space(self, needed: int) -> None:
        check_free(self.root, needed)

    def stage(self, bundle_file: Path) -> Manifest:
        """Verify and unpack a bundle into releases/<name>; reuse an identical earlier unpack.

        The uploaded file is always verified in full, even when its release is already unpacked:
        a tampered or truncated upload is refused either way.
        """
        manifest = read_manifest(bundle_file)
        final = self.release_dir(manifest.release_name)
        if final.is_dir():
            verify_bundle(bundle_file)
            try:
                self.load_release(manifest.release_name)
                return manifest
            except BundleError:
                shutil.rmtree(final)
        self.check_space(sum(a.size for a in manifest.artifacts))
        with atomic_folder(final) as tmp:  # releases/.tmp-<release> until it is whole
            extract_bundle(bundle_file, tmp)
        return manifest

    def remove_staging_leftovers(self) -> list[str]:
        """Remove the releases/.tmp-* folders of a stage that was killed; only under `exclusive`."""
        leftovers = sorted(d.name for d in self.releases.glob(".tmp-*"))
        for name in leftovers:
            shutil.rmtree(self.releases / name, ignore_errors=True)
        return leftovers

    def load_release(self, name: str) -> Manifest:
        """Read a release's manifest and re-check its artifacts' hashes before any byte is used."""
        d = self.release_dir(name)
        try:
            manifest = Manifest.model_validate_json((d / MANIFEST_NAME).read_bytes())
        except (OSError, ValueError) as e:
            raise BundleError(f"release {name} is unreadable: {e}") from None
        for a in manifest.artifacts:
            p = d / a.path
            if not p.is_file() or p.stat().st_size != a.size or sha256_file(p) != a.sha256:
                raise BundleError(f"release {name}: {a.path} does not match its manifest (disk corruption?)")
        return manifest

    def activate(self, name: Optional[str]) -> None:
        """Point `current` at releases/<name> atomically (None removes the link)."""
        if name is None:
            self.current_link.unlink(missing_ok=True)
        else:
            tmp = self.root / ".current.tmp"
            tmp.unlink(missing_ok=True)
            os.symlink(os.path.join("releases", name), tmp)
            os.replace(tmp, self.current_link)
        fsync_dir(self.root)

    def prune(self, keep: list[str], count: int) -> list[str]:
        """Remove releases beyond the newest `count` of `keep` (current first, then previous)."""
        wanted = set(keep[:count])
        removed = []
        for d in self.releases.iterdir():
            if d.is_dir() and d.name not in wanted:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d.name)
        return sorted(removed)
