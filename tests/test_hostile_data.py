"""Hostile data files (issue 54): labels that are not class ids, broken or huge arrays, images, text, tokenizers and
``datasets`` folders, and non-regular files. Each exits 2 with one line naming the file, the fault and the fix,
before any model runs.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import tiny_onnx
from conftest import write_config

from deploy_opt.cli import main
from deploy_opt.config.data import DataConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.data.sources import iter_batches
from dopt_common.errors import InputError

VECTOR = (InputSpec("x", ("batch", tiny_onnx.FEATURES), "float32"),)


def _data(**kwargs: object) -> DataConfig:
    return DataConfig(calibration="c.npz", evaluation="e.npz", **kwargs)  # type: ignore[arg-type]


def _read(path: Path, specs: tuple[InputSpec, ...] = VECTOR, **kwargs: object) -> list:
    return list(iter_batches(path.name, specs, _data(**kwargs), path.parent, "data.evaluation"))


def _tiny_build(tmp_path: Path, calibration: str, evaluation: str, capsys: pytest.CaptureFixture[str]) -> str:
    """``deploy_opt build`` of the tiny MLP on the two data files: it must exit 2; returns its stderr."""
    tiny_onnx.make_model(tmp_path / "tiny.onnx")
    text = f"""
name: tiny
model: {{onnx: tiny.onnx}}
data: {{calibration: "{calibration}", evaluation: "{evaluation}", metric: top1}}
benchmark: {{enabled: false}}
"""
    config = write_config(tmp_path, text)
    code = main(["build", str(config), "--profile", "ci", "--output-dir", str(tmp_path / "reports")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not (tmp_path / "reports" / "tiny").exists()
    return err


def _rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, tiny_onnx.FEATURES)).astype(np.float32)


# 1. labels that are not class ids


@pytest.mark.parametrize(
    ("labels", "fault"),
    [
        (np.full(8, 10**12), "not below the model's 4 classes"),
        (np.full(8, -5), "negative"),
        (np.full(8, np.nan), "not a number"),
        (np.full(8, 1.5), "not a whole number"),
        (np.array(["cat"] * 8), "not class indices"),
    ],
    ids=["huge", "negative", "nan", "fraction", "text"],
)
def test_labels_that_are_not_class_ids_stop_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], labels: np.ndarray, fault: str
) -> None:
    np.savez(tmp_path / "cal.npz", x=_rows(8, 0), labels=np.zeros(8, np.int64))
    np.savez(tmp_path / "eval.npz", x=_rows(8, 1), labels=labels)
    err = _tiny_build(tmp_path, "cal.npz", "eval.npz", capsys)
    assert "eval.npz" in err and fault in err and "fix:" in err, err
    assert "Traceback" not in err


def test_class_labels_are_checked_by_the_metric_too() -> None:
    from deploy_opt.evaluation.metrics import top1
    from deploy_opt.evaluation.sequence_metrics import top5

    logits = np.zeros((2, 6))
    for metric in (top1, top5):
        with pytest.raises(InputError, match="not below the model's 6 classes"):
            metric(logits, np.array([0, 6]))
    np.testing.assert_array_equal(top1(logits, np.array([0.0, 0.0])), [100.0, 100.0])


# 2. array files


def _object_npy(path: Path) -> None:
    np.save(path, np.array([{"a": 1}] * 4, dtype=object), allow_pickle=True)


def _truncated_npy(path: Path) -> None:
    np.save(path, _rows(8, 0))
    path.write_bytes(path.read_bytes()[:-100])


def _huge_npy(path: Path) -> None:
    rows = int(2.3 * 2**40) // (4 * tiny_onnx.FEATURES)  # 2.3 TiB of float32 claimed by a 200-byte file
    with path.open("wb") as handle:
        header = {"descr": "<f4", "fortran_order": False, "shape": (rows, tiny_onnx.FEATURES)}
        np.lib.format.write_array_header_1_0(handle, header)
        handle.write(b"\0" * 64)


def _scalar_npy(path: Path) -> None:
    np.save(path, np.float32(1.0))


def _truncated_npz(path: Path) -> None:
    np.savez(path, x=_rows(8, 0))
    path.write_bytes(path.read_bytes()[:-60])


def _bad_crc_npz(path: Path) -> None:
    np.savez(path, x=_rows(8, 0))
    data = bytearray(path.read_bytes())
    data[300] ^= 0xFF  # inside x.npy's stored data
    path.write_bytes(bytes(data))


def _object_npz(path: Path) -> None:
    np.savez(path, x=np.array([None] * 4, dtype=object))


def _huge_npz(path: Path) -> None:
    _huge_npy(path.with_suffix(".npy"))
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(path.with_suffix(".npy"), "x.npy")


@pytest.mark.parametrize(
    ("name", "make", "fault"),
    [
        ("a.npy", _object_npy, "Python objects"),
        ("a.npy", _truncated_npy, "truncated"),
        ("a.npy", _huge_npy, r"2,355\.2 GiB, over the 16 GiB cap"),
        ("a.npy", _scalar_npy, "0-d scalar"),
        ("a.npz", _truncated_npz, "not a readable .npz"),
        ("a.npz", _bad_crc_npz, "CRC"),
        ("a.npz", _object_npz, "Python objects"),
        ("a.npz", _huge_npz, "over the 16 GiB cap"),
    ],
    ids=["object", "truncated", "huge", "scalar", "truncated-npz", "bad-crc", "object-npz", "huge-npz"],
)
def test_hostile_array_files_are_one_input_error(tmp_path: Path, name: str, make, fault: str) -> None:
    make(tmp_path / name)
    with pytest.raises(InputError, match=fault) as caught:
        _read(tmp_path / name)
    assert name in str(caught.value) and "fix:" in str(caught.value)


def test_a_huge_array_header_stops_the_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "cal.npz", x=_rows(8, 0))
    _huge_npy(tmp_path / "eval.npy")
    err = _tiny_build(tmp_path, "cal.npz", "eval.npy", capsys)
    assert "eval.npy" in err and "16 GiB cap" in err and "Traceback" not in err, err


def test_a_fifo_or_a_device_as_data_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "data.npz")
    with pytest.raises(InputError, match="is a FIFO|not a regular file"):
        _read(tmp_path / "data.npz")
    with pytest.raises(InputError, match="not a regular file"):
        list(iter_batches("/dev/zero", VECTOR, _data(), tmp_path, "data.evaluation"))


# 3. images


def _png_header(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims ``width`` x ``height`` (its pixels are never there: only the header is read)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b""))


@pytest.mark.parametrize(("width", "height"), [(20_000, 20_000), (12_000, 10_000)], ids=["bomb", "over-cap"])
def test_an_image_over_max_pixels_is_refused_from_its_header(tmp_path: Path, width: int, height: int) -> None:
    _png_header(tmp_path / "photos" / "huge.png", width, height)
    spec = (InputSpec("x", ("batch", 3, 8, 8), "float32"),)
    with pytest.raises(InputError, match=r"huge\.png' is too large .*100,000,000 pixels \(MAX_PIXELS\); fix:"):
        _read(tmp_path / "photos", spec)


def test_16_bit_and_float_images_are_scaled_not_clipped(tmp_path: Path) -> None:
    from PIL import Image

    from deploy_opt.data.images import decode

    wide = np.array([[0, 257 * 100, 65535, 257 * 7]], dtype=np.uint16)
    Image.fromarray(wide).save(tmp_path / "wide.png")
    np.testing.assert_array_equal(np.asarray(decode(tmp_path / "wide.png", "L", "data")), [[0, 100, 255, 7]])
    unit = np.array([[0.0, 0.2, 1.0, 0.5]], dtype=np.float32)
    Image.fromarray(unit).save(tmp_path / "unit.tiff")
    np.testing.assert_array_equal(np.asarray(decode(tmp_path / "unit.tiff", "L", "data")), [[0, 51, 255, 128]])


# 4. text files

TOKENS = (InputSpec("input_ids", ("batch", "seq"), "int64"), InputSpec("attention_mask", ("batch", "seq"), "int64"))


@pytest.mark.parametrize(
    ("name", "content", "fault"),
    [
        ("a.txt", b"caf\xe9 au lait\n", r"line 1 is not UTF-8 \(invalid continuation byte at byte 3\)"),
        ("a.txt", "hello\nworld\n".encode("utf-16"), "line 1 is not UTF-8"),
        ("a.txt", "hello\nworld\n".encode("utf-16-le"), "line 1 holds NUL bytes"),
        ("a.txt", b"ok\n" + b"x" * (2**20 + 1) + b"\n", r"line 2 is over 1,048,576 bytes \(MAX_LINE_BYTES\)"),
        ("a.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
        ("a.jsonl", b'{"text": null}\n', "'text' is null, not a string"),
        ("a.jsonl", b'{"text": "fine"}\n{"label": 1}\n', "line 2: not a JSON object with a 'text' field"),
        ("a.jsonl", b'{"text": "fine"\n', "line 1: not valid JSON"),
    ],
    ids=["latin1", "utf16-bom", "utf16-le", "long-line", "deep-json", "null-text", "no-text", "bad-json"],
)
def test_hostile_text_files_are_one_input_error(tmp_path: Path, name: str, content: bytes, fault: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError, match=fault) as caught:
        _read(tmp_path / name, TOKENS)
    assert name in str(caught.value) and "fix:" in str(caught.value)


# 5. datasets folders


def _vectors(datasets, folder: Path, rows: int = 4) -> None:
    x = _rows(rows, 2).tolist()
    datasets.Dataset.from_dict({"x": x, "label": list(range(rows))}).save_to_disk(str(folder))


def _no_arrow(datasets, folder: Path) -> None:
    _vectors(datasets, folder)
    for arrow in folder.glob("*.arrow"):
        arrow.unlink()


def _cut_arrow(datasets, folder: Path) -> None:
    _vectors(datasets, folder)
    for arrow in folder.glob("*.arrow"):
        arrow.write_bytes(arrow.read_bytes()[:100])


def _empty(datasets, folder: Path) -> None:
    datasets.Dataset.from_dict({"x": []}).save_to_disk(str(folder))


def _bad_state(datasets, folder: Path) -> None:
    _vectors(datasets, folder)
    (folder / "state.json").write_text("{not json", encoding="utf-8")


def _bad_image(datasets, folder: Path) -> None:
    features = datasets.Features({"image": datasets.Image()})
    datasets.Dataset.from_dict({"image": [{"bytes": b"junk", "path": None}]}, features=features).save_to_disk(
        str(folder)
    )


def _other_columns(datasets, folder: Path) -> None:
    datasets.Dataset.from_dict({"pixels": [[0.0]], "label": [0]}).save_to_disk(str(folder))


def _bad_splits(datasets, folder: Path) -> None:
    folder.mkdir()
    (folder / "dataset_dict.json").write_text("[]", encoding="utf-8")


@pytest.mark.parametrize(
    ("make", "fault"),
    [
        (_no_arrow, "cannot be read \\(FileNotFoundError"),
        (_cut_arrow, "cannot be read"),
        (_empty, "has no rows"),
        (_bad_state, "cannot be read"),
        (_bad_image, r"cannot be read in row batch 0 \(UnidentifiedImageError"),
        (_other_columns, r"has columns \['pixels', 'label'\]"),
        (_bad_splits, "is not a JSON object"),
    ],
    ids=["no-arrow", "cut-arrow", "empty", "bad-state", "bad-image", "other-columns", "bad-splits"],
)
def test_broken_datasets_folders_are_one_input_error(tmp_path: Path, make, fault: str) -> None:
    datasets = pytest.importorskip("datasets")
    make(datasets, tmp_path / "split")
    specs = (InputSpec("x", ("batch", 3, 8, 8), "float32"),) if make is _bad_image else VECTOR
    with pytest.raises(InputError, match=fault) as caught:
        _read(tmp_path / "split", specs)
    assert "split" in str(caught.value) and "fix:" in str(caught.value)


# 6. init


def test_init_refuses_one_file_for_both_splits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny_onnx.make_model(tmp_path / "tiny.onnx")
    np.savez(tmp_path / "data.npz", x=_rows(8, 0), labels=np.zeros(8, np.int64))
    os.symlink(tmp_path / "data.npz", tmp_path / "same.npz")
    for second in ("data.npz", "same.npz"):
        args = ["init", str(tmp_path / "tiny.onnx"), str(tmp_path / "data.npz"), str(tmp_path / second)]
        assert main([*args, "-o", str(tmp_path / "deploy_opt.yaml")]) == 2
        err = capsys.readouterr().err
        assert "given for both calibration and evaluation" in err and "fix:" in err, err
    assert not (tmp_path / "deploy_opt.yaml").exists()
    os.mkfifo(tmp_path / "fifo.npz")
    assert main(["init", str(tmp_path / "tiny.onnx"), str(tmp_path / "fifo.npz"), str(tmp_path / "data.npz")]) == 2
    assert "not a regular file" in capsys.readouterr().err


# 7. tokenizers


def _tokenizer_folder(folder: Path, fault: str) -> Path:
    """A BPE tokenizer.json (vocabulary a, b, ab) with one ``fault``: bad merges, no model, or cut short."""
    model = {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]], "unk_token": None}
    if fault == "merges":
        model["merges"] = [["x", "y"]]
    body = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None, "model": model}
    if fault == "no-model":
        del body["model"]
    text = json.dumps(body)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(text[:60] if fault == "cut" else text, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}', encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("fault", "message"),
    [("merges", "Token `x` out of vocabulary"), ("no-model", "Model missing"), ("cut", "EOF while parsing")],
)
def test_a_malformed_tokenizer_is_one_input_error(tmp_path: Path, fault: str, message: str) -> None:
    _tokenizer_folder(tmp_path / "tok", fault)
    (tmp_path / "a.txt").write_text("hello\n", encoding="utf-8")
    with pytest.raises(InputError, match=f"data.tokenizer: tokenizer '.*tokenizer.json' cannot be loaded .*{message}"):
        _read(tmp_path / "a.txt", TOKENS, tokenizer="tok")


def test_the_llm_tokenizer_loader_refuses_bad_merges(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from dopt_common.hf_tokenizer import load_auto_tokenizer

    with pytest.raises(InputError, match=r"model.hf: tokenizer '.*tok' cannot be loaded .*out of vocabulary.* fix:"):
        load_auto_tokenizer(_tokenizer_folder(tmp_path / "tok", "merges"), "model.hf")
