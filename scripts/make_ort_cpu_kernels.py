"""Regenerate deploy_opt/backend_tables/ort_cpu_kernels.json from the installed onnxruntime CPU wheel's own registry.

The compatibility report reads the CPU kernels from the installed onnxruntime. Where that registry cannot be read
(onnxruntime-gpu 1.31 dies with a segmentation fault reading it when TensorRT's libraries are missing; see
exporters/ort/registry.py) the report falls back to this file. Run it with the CPU wheel installed:

    python scripts/make_ort_cpu_kernels.py

Each kernel becomes ``[op, domain, since, until, {type_param: [types]}]`` as in ort_cuda_kernels.json: domain ""
is ai.onnx, ``until`` is null for "every later opset".
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from make_ort_cuda_kernels import write_kernel_table  # noqa: E402

from exporters.ort.registry import registry_rows  # noqa: E402

log = logging.getLogger("make_ort_cpu_kernels")
PROVIDER = "CPUExecutionProvider"
OPEN_END = 2**31 - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "deploy_opt" / "backend_tables" / "ort_cpu_kernels.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import onnxruntime

    kernels = sorted(
        (
            [op, domain, since, None if until >= OPEN_END else until, types]
            for provider, op, domain, since, until, types in registry_rows()
            if provider == PROVIDER
        ),
        key=json.dumps,
    )
    if not kernels:
        raise SystemExit(f"the installed onnxruntime {onnxruntime.__version__} registers no {PROVIDER} kernels")
    version = onnxruntime.__version__
    source = f"the kernel registry of the onnxruntime {version} CPU wheel from PyPI"
    write_kernel_table(args.out, PROVIDER, version, source, "scripts/make_ort_cpu_kernels.py", kernels)
    log.info("wrote %d %s kernels to %s", len(kernels), PROVIDER, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
