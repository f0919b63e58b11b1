"""ORT CPU latency and error of dynamic INT8 (``exporters.ort.dynamic.write_ort_dynamic``) against FP32.

Not a test: run by hand. Two tiny models are exported with torch (legacy exporter, opset 17): an LSTM
(64 → 128, 32 steps, a Linear head) and an MLP (256 → 512 → 512 → 10, Gemm nodes). Each is written in dynamic
INT8 per channel and per tensor, and every model is timed in one ORT CPU session (``dopt_common.ort.
create_session``, all graph optimisations, ``--threads`` threads) on one batch of ``--batch``: the median of
``--runs`` runs after 20 warm-up runs. The error is max |INT8 − FP32| / max |FP32| on that batch. The ``uneven``
rows scale a quarter of each weight's output channels by 20 first, the case per-channel scales are for.

    python benchmarks/int8/dynamic_int8.py                       # batch 8, 2 threads, 300 runs
    python benchmarks/int8/dynamic_int8.py --runs 1000 --threads 1
"""

from __future__ import annotations

import argparse
import logging
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger("benchmarks.dynamic_int8")


def _models(batch: int) -> dict[str, tuple[object, np.ndarray]]:
    import torch

    class Lstm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(64, 128, batch_first=True)
            self.head = torch.nn.Linear(128, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, _ = self.lstm(x)
            return self.head(y[:, -1])

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    return {
        "lstm": (Lstm().eval(), torch.randn(batch, 32, 64)),
        "mlp": (mlp.eval(), torch.randn(batch, 256)),
    }


def _uneven(module: object) -> object:
    """A quarter of every weight's output channels 20x larger: one scale per tensor wastes most levels on them."""
    import torch

    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.ndim == 2 and "weight" in name:
                param[: param.shape[0] // 4] *= 20
    return module


def _export(module: object, example: object, path: Path) -> Path:
    import torch

    torch.onnx.export(module, example, str(path), input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    return path


def _median_us(runs: dict[str, Callable[[], None]], count: int) -> dict[str, float]:
    """Median µs of each callable, timed in turn (one run of each per round), so a load change on a shared
    machine falls on every model alike."""
    from dopt_common.timer import fixed, median_ms, time_rounds, warm_up

    warm_up(runs, 20)
    return {name: median_ms(values) * 1e3 for name, values in time_rounds(runs, fixed(count)).items()}


def _rows(name: str, fp32: Path, feed: dict, args: argparse.Namespace, tmp: Path) -> list[str]:
    from dopt_common.ort import create_session
    from dopt_common.timer import runner
    from exporters.ort.dynamic import write_ort_dynamic

    paths = {"FP32": fp32}
    for per_channel, label in ((True, "dynamic INT8 per channel"), (False, "dynamic INT8 per tensor")):
        paths[label] = write_ort_dynamic(fp32, tmp / f"{name}.{per_channel}.onnx", per_channel=per_channel).path
    sessions = {label: create_session(path, threads=args.threads) for label, path in paths.items()}
    medians = _median_us({label: runner(s.run, None, feed) for label, s in sessions.items()}, args.runs)
    reference = sessions["FP32"].run(None, feed)[0]
    rows = []
    for label, session in sessions.items():
        error = float(np.abs(session.run(None, feed)[0] - reference).max() / np.abs(reference).max())
        shown = "-" if label == "FP32" else f"{error:.4f}"
        speedup = medians["FP32"] / medians[label]
        rows.append(f"| {name} | {label} | {medians[label]:.1f} | {speedup:.2f}x | {shown} |")
    return rows


def _cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return ", ".join(sorted(set(re.findall(r"\b(avx\S*|amx\S*)", text)))) or "unknown"


def main() -> None:
    """Print one markdown table: model, form, median latency, speedup over FP32, relative error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import onnxruntime

    lines = [
        f"onnxruntime {onnxruntime.__version__}; batch {args.batch}, {args.threads} threads, "
        f"median of {args.runs} runs",
        f"CPU flags: {_cpu_flags()}",
        "",
        "| model | form | median µs | speedup | max rel. error |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for name, (module, example) in _models(args.batch).items():
            feed = {"x": example.numpy()}
            lines += _rows(name, _export(module, example, tmp / f"{name}.onnx"), feed, args, tmp)
            uneven = _export(_uneven(module), example, tmp / f"{name}.uneven.onnx")
            lines += _rows(f"{name} (uneven)", uneven, feed, args, tmp)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
