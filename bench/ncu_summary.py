"""One line per kernel from the text that bench/gpu_ncu.sh saves (Nsight Compute's default report):

    python3 bench/ncu_summary.py OUT/ncu.<bundle>.txt [...]      # also reads .txt.xz

Columns: duration (us, at the clocks ncu locks), SM and L1/TEX throughput (% of peak), DRAM (%), achieved
occupancy (%), registers per thread, grid x block, and what ncu flagged about memory access: the bytes used
per 32-byte sector of global loads/stores, and the ways of shared-memory bank conflicts with the share of
wavefronts they cost.
"""

from __future__ import annotations

import lzma
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HEADER = re.compile(r"^  (\w+) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
METRICS = {
    "Duration": "us",
    "Compute (SM) Throughput": "sm",
    "L1/TEX Cache Throughput": "l1",
    "DRAM Throughput": "dram",
    "Achieved Occupancy": "occ",
    "Registers Per Thread": "regs",
}
SECTOR = re.compile(r"global (loads|stores)(?: from L1TEX)? might not be optimal\. On average, only ([\d.]+) of the 32")
BANKS = re.compile(r"shared (loads|stores) might not be optimal and causes on average a ([\d.]+) - way bank")
SHARE = re.compile(r"([\d.]+)% of the overall \d+ wavefronts")


@dataclass
class Kernel:
    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    values: dict[str, float] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)


def parse(text: str) -> list[Kernel]:
    kernels: list[Kernel] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        head = HEADER.match(line)
        if head:
            nums = tuple(int(g) for g in head.groups()[1:])
            kernels.append(Kernel(head.group(1), nums[:3], nums[3:]))
            continue
        if not kernels:
            continue
        k = kernels[-1]
        for label, key in METRICS.items():
            m = re.match(rf"\s+{re.escape(label)}\s+\S+(?:/\S+)?\s+([\d.,]+)\s*$", line)
            if m:
                k.values[key] = float(m.group(1).replace(",", ""))
        # ncu wraps its advice over several lines: read the paragraph as one
        if "Est. Speedup" in line or "Est. Local Speedup" in line:
            para = " ".join(s.strip() for s in lines[i : i + 5])
            if m := SECTOR.search(para):
                k.flags.append(f"{m.group(1)} {m.group(2)}/32 B")
            if m := BANKS.search(para):
                share = SHARE.search(para)
                k.flags.append(f"shared {m.group(1)} {m.group(2)}-way" + (f" ({share.group(1)}%)" if share else ""))
    return kernels


def read(path: Path) -> str:
    data = path.read_bytes()
    return (lzma.decompress(data) if path.suffix == ".xz" else data).decode("utf-8", "replace")


def main() -> int:
    for arg in sys.argv[1:]:
        print(f"== {arg}")
        print(
            f"{'kernel':60s} {'us':>7s} {'SM%':>5s} {'L1%':>5s} {'DRAM%':>5s} {'occ%':>5s} {'regs':>4s}  grid x block"
        )
        for k in parse(read(Path(arg))):
            v = k.values
            nums = " ".join(
                f"{v.get(key, float('nan')):{w}.{p}f}"
                for key, w, p in (
                    ("us", 7, 1),
                    ("sm", 5, 1),
                    ("l1", 5, 1),
                    ("dram", 5, 1),
                    ("occ", 5, 1),
                    ("regs", 4, 0),
                )
            )
            grid = "x".join(map(str, k.grid)) + " x " + "x".join(map(str, k.block))
            print(f"{k.name[:60]:60s} {nums}  {grid}  {'; '.join(k.flags)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
