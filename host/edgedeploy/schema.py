"""Regenerate the JSON Schemas in docs/ from the pydantic models: `python -m edgedeploy.schema`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edgedeploy_agent.bundle import manifest_json_schema
from edgedeploy_agent.report import Report


def schemas() -> dict[str, dict[str, object]]:
    return {"bundle-manifest.schema.json": manifest_json_schema(), "report.schema.json": Report.model_json_schema()}


DOCS = Path(__file__).resolve().parents[2] / "docs"


def main(out: Path = DOCS) -> int:
    for name, schema in schemas().items():
        (out / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
