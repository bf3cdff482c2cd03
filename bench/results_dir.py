"""Where a benchmark's raw outputs go: a folder outside the source tree, one per run (bench/README.md).

    python3 bench/results_dir.py OUT         # makes OUT, prints its absolute path; refuses OUT inside this repository
    python3 bench/results_dir.py --new NAME  # makes and prints $EDGEDEPLOY_RESULTS/<UTC date>-NAME
                                             # ($EDGEDEPLOY_RESULTS defaults to ~/.cache/edgedeploy/bench)

The shell benchmarks take their OUT through the first form (`out=$(python3 bench/results_dir.py "$2")`), so a run
never writes into the tree; what a run concluded goes into docs/benchmarks.md, its raw files stay where they
were written. The records kept in the tree before (bench/results/) are in git history: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class InsideTree(ValueError):
    pass


def root() -> Path:
    """$EDGEDEPLOY_RESULTS, or ~/.cache/edgedeploy/bench."""
    return Path(os.environ.get("EDGEDEPLOY_RESULTS") or Path.home() / ".cache" / "edgedeploy" / "bench")


def out_dir(path: str | Path) -> Path:
    """`path` made and resolved; InsideTree where it lies inside this repository."""
    out = Path(path).expanduser().resolve()
    if out == REPO or REPO in out.parents:
        raise InsideTree(f"{path}: inside the source tree ({REPO}); raw outputs go outside it (bench/README.md)")
    out.mkdir(parents=True, exist_ok=True)
    return out


def new_run(name: str) -> Path:
    """A fresh folder for one run: <root()>/<UTC date>-<name>."""
    return out_dir(root() / f"{time.strftime('%Y-%m-%d', time.gmtime())}-{name}")


def output_file(path: str | Path | None, run_name: str, file_name: str) -> Path:
    """Where a Python benchmark writes its file: `path` (its folder made) or, for None, `file_name` in a new run's
    folder. A folder inside the tree ends the benchmark with one line, before it measures anything."""
    try:
        if path is None:
            return new_run(run_name) / file_name
        return out_dir(Path(path).parent) / Path(path).name
    except InsideTree as e:
        raise SystemExit(f"{run_name}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("out", nargs="?", help="a folder outside the source tree")
    ap.add_argument("--new", metavar="NAME", help="a fresh folder under $EDGEDEPLOY_RESULTS instead")
    args = ap.parse_args(argv)
    if (args.out is None) == (args.new is None):
        ap.error("give OUT or --new NAME")
    try:
        print(new_run(args.new) if args.new else out_dir(args.out))
    except (InsideTree, OSError) as e:
        print(f"results: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
