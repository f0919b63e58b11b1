"""benchmarks/corpus's venv peers (NNCF, AIMET, ModelOpt): their command lines, the calibration file they read,
the scorer's line protocol and AIMET's free-dimension fix. No venv is created and nothing is installed."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from conftest import CORPUS, corpus_modules
from onnx import TensorProto, helper


@pytest.fixture(scope="module")
def corpus():  # noqa: ANN201 - the benchmark harness modules, imported by path
    aimet_peer, nncf_peer, peers, scorer = corpus_modules("aimet_peer", "nncf_peer", "peers", "scorer")
    return SimpleNamespace(peers=peers, scorer=scorer, nncf_peer=nncf_peer, aimet_peer=aimet_peer)


def test_batches_round_trip_in_order_with_several_inputs(corpus, tmp_path: Path) -> None:
    batches = [{"x": np.full((2, 3), i, np.float32), "mask": np.arange(i + 1)} for i in range(12)]
    path = corpus.peers.write_batches(batches, tmp_path / "calibration.npz")
    back = corpus.peers.read_batches(path)
    assert len(back) == 12 and [b["x"][0, 0] for b in back] == list(range(12))
    assert all(np.array_equal(a["mask"], b["mask"]) for a, b in zip(batches, back, strict=True))
    assert corpus.nncf_peer.Batches(back).batch_size == 2


def test_commands(corpus, tmp_path: Path) -> None:
    peers = corpus.peers
    model, data, out = tmp_path / "m.onnx", tmp_path / "c.npz", tmp_path / "o.onnx"
    plain = peers.nncf_command(model, data, out)
    assert plain[0] == str(peers.NNCF_VENV.python) and plain[1].endswith("nncf_peer.py") and "--scorer" not in plain
    scorer = ["python", "scorer.py", "textdir.yaml", "m.onnx"]
    ac = peers.nncf_command(model, data, out, scorer=scorer, max_drop=5.0)
    assert ac[ac.index("--max-drop") + 1] == "5.0" and json.loads(ac[ac.index("--scorer") + 1]) == scorer
    aimet = peers.aimet_command(model, data, out, budget_s=839.6)
    assert aimet[0] == str(peers.AIMET_VENV.python) and aimet[-1] == "--budget-s=840"
    assert set(peers.BOUNDED) <= set(peers.VENVS) and set(peers.VENVS) <= set(peers.TOOLS)


def test_venvs_pin_this_environments_onnxruntime_and_onnx(corpus) -> None:
    from importlib.metadata import version

    peers = corpus.peers
    pins = [f"onnxruntime=={version('onnxruntime')}", f"onnx=={version('onnx')}"]
    assert peers.NNCF_VENV.install()[-3:] == [peers.NNCF, *pins]
    assert peers.AIMET_VENV.install()[-4:] == [peers.AIMET, peers.TORCH_PIN, *pins]
    assert not set(pins) & set(peers.MODELOPT_VENV.install())  # onnxruntime-gpu comes with ModelOpt
    assert peers.NNCF_VENV.folder == CORPUS / ".cache" / "nncf-venv"


def test_scorer_protocol(corpus) -> None:
    calls = []

    class Fake:
        items = [0, 1, 2]
        metric = SimpleNamespace(higher_is_better=True)

        def scores(self, model: Path, items: list[int] | None = None) -> list[list[float]]:
            calls.append((model, items))
            if model.name == "broken.onnx":
                raise ValueError("ORT cannot load it\nsecond line")
            return [[100.0, 0.0]] * len(items or self.items)

    requests = io.StringIO('{"model": "a.onnx", "items": [2]}\n\n{"model": "broken.onnx"}\n')
    answers = io.StringIO()
    corpus.scorer.serve(Fake(), requests, answers)
    lines = answers.getvalue().splitlines()
    assert all(line.startswith(corpus.scorer.TAG) for line in lines)
    said = [json.loads(line[len(corpus.scorer.TAG) :]) for line in lines]
    assert said == [
        {"items": 3, "higher_is_better": True},
        {"scores": [[100.0, 0.0]]},
        {"error": "ValueError: ORT cannot load it"},
    ]
    assert calls == [(Path("a.onnx"), [2]), (Path("broken.onnx"), None)]


def test_aimet_names_dimensions_stored_as_minus_one(corpus) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    assert corpus.aimet_peer._free_dims(model) == ["x_0"]
    assert [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == ["x_0", 3]
    onnx.checker.check_model(model)
