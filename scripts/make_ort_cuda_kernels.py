"""Regenerate deploy_opt/backend_tables/ort_cuda_kernels.json from ONNX Runtime's published kernel table.

ONNX Runtime generates ``docs/OperatorKernels.md`` from its registered kernels (tools/python/gen_opkernel_doc.py).
The CPU wheel has no CUDA kernels in its registry, so the compatibility report reads the CUDA section of that
table from this data file instead. Regenerate it from a checkout of github.com/microsoft/onnxruntime:

    git -C onnxruntime show <commit>:docs/OperatorKernels.md > /tmp/OperatorKernels.md
    python scripts/make_ort_cuda_kernels.py /tmp/OperatorKernels.md --ort-version "<VERSION_NUMBER>" \\
        --source "microsoft/onnxruntime <commit> (<date>) docs/OperatorKernels.md"

Each kernel becomes ``[op, domain, since, until, {type_param: [types]}]``: domain "" is ai.onnx (as in ORT's own
registry), ``until`` is null for "N+", types are spelled as ORT spells them ("tensor(float)").
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dopt_common.files import write_text  # noqa: E402

log = logging.getLogger("make_ort_cuda_kernels")
PROVIDER = "CUDAExecutionProvider"
# Internal layout-transform domains are not something an exported model uses.
SKIP_DOMAINS = ("com.ms.internal.nhwc",)


def provider_section(text: str, provider: str) -> list[str]:
    """The table lines of one provider's section."""
    start = text.find(f"## Operators implemented by {provider}")
    if start < 0:
        raise SystemExit(f"no '{provider}' section in the input; is it ORT's docs/OperatorKernels.md?")
    end = text.find("## Operators implemented by", start + 1)
    return [line for line in text[start : end if end > 0 else None].splitlines() if line.startswith("|")]


def parse_versions(cell: str) -> tuple[int, int | None]:
    """'13+' -> (13, None); '[6, 12]' -> (6, 12); '12' -> (12, 12)."""
    cell = cell.strip()
    if cell.endswith("+"):
        return int(cell[:-1]), None
    match = re.fullmatch(r"\[(\d+),\s*(\d+)\]", cell)
    if match:
        return int(match.group(1)), int(match.group(2))
    return int(cell), int(cell)


def parse_types(cell: str) -> dict[str, list[str]]:
    """'**T** = tensor(a), tensor(b)<br/> **T1** = ...' -> {'T': [...], 'T1': [...]}."""
    found = {}
    for part in re.split(r"<br\s*/?>", cell):
        match = re.match(r"\s*\*\*(\w+)\*\*\s*=\s*(.*)", part)
        if match:
            found[match.group(1)] = [t.strip() for t in re.split(r",\s*(?![^()]*\))", match.group(2)) if t.strip()]
    return found


def parse_kernels(lines: list[str]) -> list[list[object]]:
    """One entry per (op, domain, version range) row of the section."""
    kernels: list[list[object]] = []
    domain, op = "", ""
    for line in lines:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) < 4 or cells[0].startswith("-") or cells[0] == "Op Name":
            continue
        domain_match = re.match(r"\*\*Operator Domain:\*\*\s*\*(.+?)\*", cells[0])
        if domain_match:
            domain = "" if domain_match.group(1) == "ai.onnx" else domain_match.group(1)
            continue
        op = cells[0] or op
        if domain in SKIP_DOMAINS:
            continue
        since, until = parse_versions(cells[2])
        kernels.append([op, domain, since, until, parse_types(cells[3])])
    return kernels


def write_kernel_table(
    out: Path, provider: str, ort_version: str, source: str, generated_by: str, kernels: list[list[object]]
) -> None:
    """deploy_opt/backend_tables/ort_*_kernels.json (format deploy_opt.ort_kernels/1), one kernel a line: diffs stay
    readable when the table is regenerated for a newer ORT."""
    head = {
        "format": "deploy_opt.ort_kernels/1",
        "provider": provider,
        "ort_version": ort_version,
        "source": source,
        "generated_by": generated_by,
    }
    body = ",\n".join("    " + json.dumps(k, separators=(", ", ": ")) for k in kernels)
    text = json.dumps(head, indent=2)[:-2] + ',\n  "kernels": [\n' + body + "\n  ]\n}\n"
    json.loads(text)  # the hand-joined document must still be JSON
    write_text(out, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="ONNX Runtime's docs/OperatorKernels.md")
    parser.add_argument("--ort-version", required=True, help="VERSION_NUMBER of the commit the table came from")
    parser.add_argument("--source", required=True, help="repository, commit and date of the table")
    parser.add_argument("--out", type=Path, default=REPO / "deploy_opt" / "backend_tables" / "ort_cuda_kernels.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kernels = parse_kernels(provider_section(args.table.read_text(encoding="utf-8"), PROVIDER))
    if not kernels:
        raise SystemExit(f"no kernels parsed from the {PROVIDER} section of {args.table}")
    write_kernel_table(args.out, PROVIDER, args.ort_version, args.source, "scripts/make_ort_cuda_kernels.py", kernels)
    ops = len({(k[0], k[1]) for k in kernels})
    log.info("wrote %d %s kernels (%d ops) to %s", len(kernels), PROVIDER, ops, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
