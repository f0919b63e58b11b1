"""The installed onnxruntime's kernel registry, read so that a broken provider library cannot crash the build.

``onnxruntime.capi._pybind_state.get_all_opkernel_def()`` creates every execution provider the package ships.
onnxruntime-gpu 1.31 ships TensorRT's provider library too, and where TensorRT's own libraries (libnvinfer) are
not installed, creating it fails and the call dies with a segmentation fault (seen on an H200 with
onnxruntime-gpu 1.31.1 and no tensorrt). The CPU wheel ships no such library, so it is read in-process; any other
build is read in a child process, and a child that dies leaves the caller on the published tables.

    python -m exporters.ort.registry    # the registry as JSON rows, what the child prints
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

log = logging.getLogger(__name__)

# Providers the CPU wheel lists; its registry has kernels for the CPU provider alone.
CPU_WHEEL_PROVIDERS = frozenset({"CPUExecutionProvider", "AzureExecutionProvider"})
CHILD_TIMEOUT_S = 120
# One kernel: [provider, op, domain, since, until (2**31 - 1 for "every later opset"), {type param: [types]}].
Row = list[Any]


def registry_rows() -> list[Row]:
    """Every registered kernel of the onnxruntime imported in this process."""
    from onnxruntime.capi import _pybind_state

    return [
        [
            d.provider,
            d.op_name,
            d.domain,
            int(d.version_range[0]),
            int(d.version_range[1]),
            {name: list(types) for name, types in d.type_constraints.items()},
        ]
        for d in _pybind_state.get_all_opkernel_def()
    ]


def read_registry() -> tuple[str, list[Row] | None]:
    """(onnxruntime's version, its kernels), or (version, None) when the registry could not be read."""
    import onnxruntime

    version = onnxruntime.__version__
    providers = set(onnxruntime.get_available_providers())
    if providers <= CPU_WHEEL_PROVIDERS:
        return version, registry_rows()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "exporters.ort.registry"],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("onnxruntime %s's kernel registry could not be read (%s); using the published tables", version, exc)
        return version, None
    if done.returncode != 0:
        why = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        log.warning(
            "reading onnxruntime %s's kernel registry (providers %s) died with %s; using the published kernel "
            "tables. Usually a provider library whose own libraries are missing (TensorRT's needs libnvinfer): "
            "install them, or ignore this",
            version,
            sorted(providers),
            why,
        )
        return version, None
    return version, json.loads(done.stdout)


def main() -> int:
    """Print the registry as JSON (what :func:`read_registry`'s child process runs)."""
    json.dump(registry_rows(), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
