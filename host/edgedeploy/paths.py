"""Where the host keeps its files (config, caches, logs, pulled reports)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def config_dir() -> Path:
    """Inventory, known_hosts and user profiles. EDGEDEPLOY_CONFIG_DIR overrides (tests, CI)."""
    return Path(os.environ.get("EDGEDEPLOY_CONFIG_DIR") or platformdirs.user_config_dir("edgedeploy"))


def state_dir() -> Path:
    """Pulled reports, device logs and error logs."""
    return Path(os.environ.get("EDGEDEPLOY_STATE_DIR") or platformdirs.user_state_dir("edgedeploy"))


def cache_dir() -> Path:
    """Build cache: a rebuild of the same inputs is a copy."""
    return Path(os.environ.get("EDGEDEPLOY_CACHE_DIR") or platformdirs.user_cache_dir("edgedeploy"))


def build_store_dir() -> Path:
    """Files only the host needs (source models, Q/DQ models), by sha256. EDGEDEPLOY_STORE_DIR overrides;
    the default follows the cache folder (EDGEDEPLOY_CACHE_DIR)."""
    return Path(os.environ.get("EDGEDEPLOY_STORE_DIR") or cache_dir() / "store")
