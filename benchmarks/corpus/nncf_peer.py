"""NNCF's ONNX post-training quantization of one model, run in ``.cache/nncf-venv`` (run.py starts it there).

- ``nncf``: ``nncf.quantize(model, nncf.Dataset(batches), subset_size=<calibration samples>)``, every other
  argument NNCF's default (preset performance: symmetric int8 weights and activations; target device ANY; fast
  bias correction).
- ``nncf-ac`` (``--scorer``): ``nncf.quantize_with_accuracy_control(model, calibration, validation,
  validation_fn, max_drop=<the config's gate.max_drop>, drop_type=ABSOLUTE, subset_size=<calibration samples>)``.
  ``validation_fn`` saves the candidate model and has ``scorer.py`` (started with the command ``--scorer``
  gives, in the main environment) score it on the config's evaluation split with the corpus metric; it returns
  the mean over the samples and the mean of each evaluation batch (NNCF's per-item values, which it ranks
  quantizers by). The validation dataset's items are the batch indices.

The calibration items are the config's batches as deploy_opt gets them, shown to NNCF with the ``batch_size`` a
torch DataLoader would show (NNCF then collects statistics per sample, ``batchwise_statistics``). A file older
than opset 13 is converted to 13 first (NNCF falls back to per-tensor weights below 13, and its accuracy
control refuses such a file), as for the ORT peer. The last line says what was done (``peers.NOTE_TAG``).

    .cache/nncf-venv/bin/python benchmarks/corpus/nncf_peer.py MODEL DATA.npz OUT [--scorer JSON --max-drop 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np
import peers
from scorer import TAG


class Batches(list):
    """The calibration batches, with a DataLoader's ``batch_size`` (the first batch's size)."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        super().__init__(batches)
        self.batch_size = len(next(iter(batches[0].values())))


class Remote:
    """A ``scorer.py`` process: ``scores(path, items)`` is each evaluation batch's scores for an ONNX file."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lock = threading.RLock()  # NNCF may rank quantizers on several threads
        self.items = self._answer()["items"]

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(TAG):
                answer = json.loads(line[len(TAG) :])
                if "error" in answer:
                    raise RuntimeError(f"scorer: {answer['error']}")
                return answer
        raise RuntimeError(f"scorer exited ({self.process.wait()}) without an answer: see the log above")

    def scores(self, path: Path, items: list[int] | None = None) -> list[list[float]]:
        assert self.process.stdin is not None
        with self.lock:
            self.process.stdin.write(json.dumps({"model": str(path), "items": items}) + "\n")
            self.process.stdin.flush()
            return self._answer()["scores"]

    def mean(self, path: Path) -> float:
        """The metric over the whole evaluation split (mean over samples, as measure.score reports it)."""
        flat = [v for batch in self.scores(path) for v in batch]
        return sum(flat) / len(flat)


def quantize(model_path: Path, data: Path, out: Path, scorer: list[str] | None, max_drop: float) -> str:
    """Quantize ``model_path`` into ``out`` with NNCF; return what was done, in a line."""
    import nncf
    import onnx

    batches = Batches(peers.read_batches(data))
    samples = sum(len(next(iter(b.values()))) for b in batches)
    source, steps = peers._opset_13(model_path, out.with_name(out.stem + ".opset13.onnx"))
    model = onnx.load(str(source))
    calibration = nncf.Dataset(batches)
    if scorer is None:
        quantized = nncf.quantize(model, calibration, subset_size=samples)
        steps.append(f"nncf.quantize, preset performance, subset_size {samples}")
    else:
        remote = Remote(scorer)
        candidate = out.with_name(out.stem + ".candidate.onnx")

        def validate(candidate_model: onnx.ModelProto, items: Any) -> tuple[float, list[float]]:
            indices = [int(i) for i in items]
            with remote.lock:  # one candidate file, scored before the next is written
                onnx.save(candidate_model, str(candidate))
                scores = remote.scores(candidate, indices)
            flat = [v for batch in scores for v in batch]
            return sum(flat) / len(flat), [sum(batch) / len(batch) for batch in scores]

        quantized = nncf.quantize_with_accuracy_control(
            model,
            calibration,
            nncf.Dataset(list(range(remote.items))),
            validate,
            max_drop=max_drop,
            drop_type=nncf.DropType.ABSOLUTE,
            subset_size=samples,
        )
        onnx.save(quantized, str(candidate))
        fp32, final = remote.mean(source), remote.mean(candidate)
        candidate.unlink()
        steps.append(
            f"nncf.quantize_with_accuracy_control, max_drop {max_drop:g} absolute, subset_size {samples}: "
            f"evaluation split {fp32:.2f} -> {final:.2f}"
        )
    tmp = out.with_name(out.stem + ".tmp.onnx")
    onnx.save(quantized, str(tmp))
    tmp.replace(out)
    out.with_name(out.stem + ".opset13.onnx").unlink(missing_ok=True)
    kept = sum(node.op_type == "QuantizeLinear" for node in quantized.graph.node)
    return "; ".join([*steps, f"{kept} QuantizeLinear nodes"])


def main() -> None:
    """CLI: ``MODEL DATA OUT [--scorer JSON --max-drop D]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("data", type=Path, help="the calibration batches (peers.write_batches)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--scorer", type=json.loads, help="accuracy control: the scorer.py command, as JSON")
    parser.add_argument("--max-drop", type=float, default=1.0, help="accuracy control: the largest drop, points")
    args = parser.parse_args()
    how = quantize(args.model.resolve(), args.data.resolve(), args.out.resolve(), args.scorer, args.max_drop)
    print(f"{peers.NOTE_TAG} {how}")


if __name__ == "__main__":
    main()
