"""Benchmarks write their raw outputs outside the source tree (bench/results_dir.py, bench/README.md): every shell
benchmark that takes an OUT refuses one inside the repository before it does anything, with one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "bench" / "results_dir.py"

# the benchmarks run as `bash bench/X.sh KIT OUT ...` from the repository root
OUT_SCRIPTS = ["gpu_backend", "gpu_bench", "gpu_e2e", "gpu_ncu", "gpu_pipeline", "gpu_tune", "gpu_variants"]


def test_every_shell_benchmark_with_an_out_is_checked_here() -> None:
    takes_out = {p.stem for p in (REPO / "bench").glob("*.sh") if "OUT" in p.read_text().split("set -", 1)[0]}
    assert takes_out == set(OUT_SCRIPTS)


@pytest.mark.parametrize("script", OUT_SCRIPTS)
def test_a_benchmark_refuses_an_out_inside_the_tree(script: str, tmp_path: Path) -> None:
    inside = REPO / "bench" / f"never-made-{os.getpid()}"
    p = subprocess.run(
        ["bash", f"bench/{script}.sh", str(tmp_path / "kit"), str(inside), "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [
        f"results: {inside}: inside the source tree ({REPO}); raw outputs go outside it (bench/README.md)"
    ]
    assert not inside.exists()


def test_an_out_outside_the_tree_is_made_and_printed(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    p = subprocess.run([sys.executable, str(RESULTS_DIR), str(out)], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == str(out.resolve()) and out.is_dir()


def test_a_new_run_gets_a_dated_folder_under_edgedeploy_results(tmp_path: Path) -> None:
    env = {**os.environ, "EDGEDEPLOY_RESULTS": str(tmp_path)}
    p = subprocess.run(
        [sys.executable, str(RESULTS_DIR), "--new", "peer"], env=env, capture_output=True, text=True, check=True
    )
    made = Path(p.stdout.strip())
    assert made == tmp_path / f"{time.strftime('%Y-%m-%d', time.gmtime())}-peer" and made.is_dir()


def test_a_new_run_inside_the_tree_is_refused() -> None:
    env = {**os.environ, "EDGEDEPLOY_RESULTS": str(REPO / "bench" / "results")}
    p = subprocess.run([sys.executable, str(RESULTS_DIR), "--new", "peer"], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "inside the source tree" in p.stderr
    assert not (REPO / "bench" / "results").exists()
