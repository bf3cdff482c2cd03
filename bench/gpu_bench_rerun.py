"""Which groups of a gpu_vs_torch.py run bench/gpu_bench.sh runs again after a CUDA fault (the JSON's "fault"):

    python3 bench/gpu_bench_rerun.py RESULT.json MODELS BATCHES

prints "MODEL BATCHES" for the faulting model's batches from the faulting one on, then "MODELS BATCHES" for
the models after it (nothing when the run had no fault). MODELS and BATCHES are the run's own, comma-separated.
"""

from __future__ import annotations

import json
import sys


def groups_to_rerun(result: dict, models: list[str], batches: list[str]) -> list[tuple[str, str]]:
    fault = result.get("fault")
    if not fault:
        return []
    m, b = models.index(fault["model"]), batches.index(str(fault["batch"]))
    out = [(fault["model"], ",".join(batches[b:]))]
    if models[m + 1 :]:
        out.append((",".join(models[m + 1 :]), ",".join(batches)))
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        result = json.load(f)
    for models, batches in groups_to_rerun(result, sys.argv[2].split(","), sys.argv[3].split(",")):
        print(models, batches)
