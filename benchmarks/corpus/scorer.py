"""nncf-ac's validation function, in this environment: score candidate ONNX files on a config's evaluation split.

``nncf_peer.py`` (in the NNCF venv, which has neither the data modules nor deploy_opt) starts this process and
asks it to score each model NNCF proposes. The scoring is ``measure.py``'s, the one every row of RESULTS.md gets:
the config's metric (``resolve_metric``) on the first output of an ORT CPU session (``measure.session``) against
the label, or against the FP32 model's first output where the data has no labels (``measure.score``'s rule),
batch by batch (``measure.batch_scores``). The references are computed once, at start.

Protocol, one JSON object per line, each answer's line starting with ``TAG`` (anything else on stdout is noise
from the data code): first ``{"items": N, "higher_is_better": bool}`` (N evaluation batches), then for each
request ``{"model": path, "items": [batch indices] or null}`` one ``{"scores": [[batch scores], ...]}`` or
``{"error": "..."}``. A lower-is-better metric's scores are negated, since NNCF maximises.

    python benchmarks/corpus/scorer.py CONFIG FP32_ONNX    # nncf_peer.py starts it
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import measure
import numpy as np

TAG = "scorer:"


class Scorer:
    """The evaluation batches of ``config`` with their references, and the metric that scores a candidate."""

    def __init__(self, config: Path, fp32: Path) -> None:
        from deploy_opt.evaluation.metrics import resolve_metric

        self.metric = resolve_metric(measure.load_config(config)["data"]["metric"], config.parent)
        evaluation = measure.load_data(config, "evaluation")
        reference = measure.session(fp32)
        self.items = [
            (inputs, reference.run(None, inputs)[0] if label is None else np.asarray(label))
            for inputs, label, _ in evaluation
        ]

    def scores(self, model: Path, items: list[int] | None = None) -> list[list[float]]:
        """Each chosen batch's scores for ``model`` (all batches by default), higher is better."""
        session = measure.session(model)
        sign = 1.0 if self.metric.higher_is_better else -1.0
        chosen = range(len(self.items)) if items is None else items
        return [[sign * v for v in measure.batch_scores(self.metric, session, *self.items[i])] for i in chosen]


def serve(scorer: Scorer, requests: TextIO, answers: TextIO) -> None:
    """Answer ``requests`` (one JSON line each) until it closes."""

    def say(message: dict[str, Any]) -> None:
        answers.write(f"{TAG} {json.dumps(message)}\n")
        answers.flush()

    say({"items": len(scorer.items), "higher_is_better": scorer.metric.higher_is_better})
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            say({"scores": scorer.scores(Path(request["model"]), request.get("items"))})
        except Exception as exc:  # noqa: BLE001 - the candidate's failure is NNCF's to see, not this process's end
            say({"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"})


def main() -> None:
    """CLI: ``CONFIG FP32_ONNX``, then the protocol on stdin/stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("fp32", type=Path)
    args = parser.parse_args()
    serve(Scorer(args.config.resolve(), args.fp32.resolve()), sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
