"""Embedding fidelity of a built encoder: cosine to FP32 and nearest-neighbour agreement, on ORT CPU.

For the evaluation sentences of ``encoder.py``, both ``model.onnx`` and ``model.int8.onnx`` of a build embed
every sentence. It prints the mean and minimum cosine between the two embeddings of each sentence, and the share
of sentences whose nearest neighbour (by cosine, among the other evaluation sentences) is the same sentence in
both: what a retrieval index built on the INT8 model would get right.

    python benchmarks/unseen/neighbours.py benchmarks/unseen/.cache/reports/unseen-encoder
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from dopt_common.ort import create_session
from dopt_common.siblings import sibling

HERE = Path(__file__).resolve().parent


def _embed(path: Path, batches: list) -> np.ndarray:
    session = create_session(path, threads=2)
    out = np.concatenate([session.run(None, item[0])[0] for item in batches])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _neighbours(embeddings: np.ndarray) -> np.ndarray:
    similarity = embeddings @ embeddings.T
    np.fill_diagonal(similarity, -np.inf)
    return similarity.argmax(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", type=Path, help="a build folder holding model.onnx and model.int8.onnx")
    args = parser.parse_args()
    encoder = sibling(__file__, "encoder")
    batches = encoder.evaluation_data()
    fp32, int8 = _embed(args.build / "model.onnx", batches), _embed(args.build / "model.int8.onnx", batches)
    cosine = (fp32 * int8).sum(axis=1)
    agreement = float((_neighbours(fp32) == _neighbours(int8)).mean())
    print(
        f"{len(cosine)} sentences: cosine mean {cosine.mean():.4f}, min {cosine.min():.4f}; "
        f"nearest-neighbour agreement {agreement:.3f}"
    )


if __name__ == "__main__":
    main()
