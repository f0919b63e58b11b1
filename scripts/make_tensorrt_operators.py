"""Regenerate deploy_opt/backend_tables/tensorrt_operators.csv and tensorrt_versions.csv from onnx-tensorrt's tables.

Input: a CSV with the columns ``tensorrt,operator,supported,types,restrictions``, one row per TensorRT version
and ONNX operator, transcribed from ``docs/operators.md`` of github.com/onnx/onnx-tensorrt on the release
branches 8.6-GA, 9.3, 10.0-GA and 10.1-GA (the project keeps one at shared/data/onnx-tensorrt-operators.csv).

    python scripts/make_tensorrt_operators.py shared/data/onnx-tensorrt-operators.csv

The rows are checked (known version, Y/N, no duplicate), the type lists normalised to "A, B, C", sorted by
version then operator, and written with the opset range each version's parser supports.
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dopt_common.files import write_text  # noqa: E402

log = logging.getLogger("make_tensorrt_operators")

# version -> (onnx-tensorrt branch, lowest opset, highest opset); the parser README of each branch.
# An empty lowest opset: the branch's README states none.
VERSIONS = {
    "8.6": ("8.6-GA", None, 17),
    "9.3": ("9.3", None, 19),
    "10.0": ("10.0-GA", 9, 20),
    "10.1": ("10.1-GA", 9, 20),
}
COLUMNS = ("tensorrt", "operator", "supported", "types", "restrictions")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def read_rows(path: Path) -> list[dict[str, str]]:
    """The input rows, checked and normalised."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    seen: set[tuple[str, str]] = set()
    out = []
    for number, row in enumerate(rows, start=2):
        version, op, supported = row["tensorrt"].strip(), row["operator"].strip(), row["supported"].strip()
        if version not in VERSIONS:
            raise SystemExit(f"{path}:{number}: unknown TensorRT version '{version}'; known: {', '.join(VERSIONS)}")
        if supported not in ("Y", "N"):
            raise SystemExit(f"{path}:{number}: supported must be Y or N, not '{supported}'")
        if (version, op) in seen:
            raise SystemExit(f"{path}:{number}: duplicate row for {op} in TensorRT {version}")
        seen.add((version, op))
        types = ", ".join(t for t in re.split(r"[,\s]+", row["types"].strip()) if t)
        out.append(dict(zip(COLUMNS, (version, op, supported, types, row["restrictions"].strip()), strict=True)))
    out.sort(key=lambda r: (_version_key(r["tensorrt"]), r["operator"]))
    return out


def render_csv(rows: list[dict[str, str]], columns: tuple[str, ...]) -> str:
    """CSV text with a header row and Unix line ends."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="onnx-tensorrt operator CSV (tensorrt,operator,supported,...)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "deploy_opt" / "backend_tables")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = read_rows(args.source)
    missing = set(VERSIONS) - {r["tensorrt"] for r in rows}
    if missing:
        raise SystemExit(f"{args.source}: no rows for TensorRT {', '.join(sorted(missing))}")
    write_text(args.out_dir / "tensorrt_operators.csv", render_csv(rows, COLUMNS))
    versions = [
        {"tensorrt": v, "branch": b, "min_opset": "" if lo is None else str(lo), "max_opset": str(hi)}
        for v, (b, lo, hi) in VERSIONS.items()
    ]
    write_text(
        args.out_dir / "tensorrt_versions.csv", render_csv(versions, ("tensorrt", "branch", "min_opset", "max_opset"))
    )
    log.info("wrote %d operator rows for TensorRT %s to %s", len(rows), ", ".join(VERSIONS), args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
