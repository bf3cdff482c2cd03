"""How long `edgedeploy` takes to start: each command timed as a whole process, start to exit.

    .venv/bin/python bench/startup.py [--runs 10] [--edgedeploy PATH]

The commands a newcomer types first: --help, --version, `profiles list` and `status` (on a fresh machine: no
devices, so it stops with an error after reading the empty inventory). Config, state and cache folders are empty
temporary ones. Each command runs once unmeasured (the page cache), then --runs times; the table gives min and
median wall seconds. Target: a median under 0.5 s for each. `python -X importtime -m edgedeploy.cli.main --help`
says where the time goes.

The console script beside this Python is timed (--edgedeploy another); PYTHONPATH passes through, so
`PYTHONPATH=OTHER/host:OTHER/agent .venv/bin/python bench/startup.py` times another checkout's code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = [["--help"], ["--version"], ["profiles", "list"], ["status"]]
TARGET_S = 0.5


def time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--edgedeploy", help="the console script (default: the one beside this Python, or on PATH)")
    args = parser.parse_args()
    beside = Path(sys.executable).parent / "edgedeploy"
    exe = args.edgedeploy or (str(beside) if beside.exists() else shutil.which("edgedeploy"))
    if exe is None:
        sys.exit("no edgedeploy console script: pass --edgedeploy")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        for name in ("CONFIG", "STATE", "CACHE"):
            env[f"EDGEDEPLOY_{name}_DIR"] = str(Path(tmp) / name.lower())
        print(f"{exe}, {args.runs} runs each, wall seconds (target: median < {TARGET_S})")
        print(f"{'command':<28}{'min':>8}{'median':>8}")
        for command in COMMANDS:
            argv = [exe, *command]
            time_once(argv, env)
            times = [time_once(argv, env) for _ in range(args.runs)]
            print(f"{'edgedeploy ' + ' '.join(command):<28}{min(times):>8.3f}{statistics.median(times):>8.3f}")


if __name__ == "__main__":
    main()
