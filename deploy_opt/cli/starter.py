"""``init MODEL [DATA [EVAL_DATA]]``: a commented starter config that ``build`` runs unchanged.

It reads the model (an ONNX file's inputs, their dimensions and dtypes, and its first output; or a Hugging Face
folder's config.json, whose architecture gives the task) and the data (its type: arrays, image folder with or
without class folders, text lines), and writes the model, data and metric sections with a comment on each
choice. One DATA path must hold its two splits (``calibration``/``calib``/``train`` and
``evaluation``/``eval``/``val``/``validation``/``test``, as files or folders); two paths are the splits.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from deploy_opt.config.hf import TASKS, hf_inputs, read_hf_config
from deploy_opt.config.model import InputSpec
from deploy_opt.data.arrays import NpzReader
from deploy_opt.data.files import ARRAY_SUFFIXES, LABEL_KEYS, TEXT_SUFFIXES, image_files
from deploy_opt.data.text_files import read_texts
from deploy_opt.stages.export import input_specs_from_onnx
from dopt_common.errors import InputError, OutputError
from dopt_common.files import regular_input, write_text
from exporters.onnx.checks import read_onnx_graph

CALIBRATION_NAMES = ("calibration", "calib", "train")
EVALUATION_NAMES = ("evaluation", "eval", "val", "validation", "test")


@dataclass(frozen=True)
class StarterConfig:
    """The written config and what it found."""

    path: Path
    model_kind: str  # "onnx" | "hf"
    data_kind: str  # "arrays" | "images" | "text" | "dataset"
    labelled: bool
    metric: str


@dataclass(frozen=True)
class _Model:
    lines: list[str]
    kind: str
    specs: tuple[InputSpec, ...]
    output_shape: tuple[int | str, ...] | None
    task: str | None
    tokenizer: Path | None  # a folder with tokenizer.json beside the model, or the HF folder
    outputs: int = 1  # graph outputs: a YOLO head is one [batch, 4 + classes, anchors] tensor


def write_starter(model: Path, data: list[Path], out: Path, force: bool = False) -> StarterConfig:
    """Inspect ``model`` and ``data`` and write the starter config to ``out`` (never over a file unless ``force``)."""
    if out.exists() and not force:
        raise OutputError(f"init: '{out}' exists; fix: pass another --output, or --force to replace it")
    found = _inspect_model(model, out.parent)
    calibration, evaluation = _splits(data)
    kind, labelled = _data_kind(calibration)
    metric = _metric(found, labelled)
    lines = [
        f"# deploy_opt build config written by 'init' for {model.name}; run: python -m deploy_opt build {out.name}"
    ]
    lines += [f"name: {_run_name(model)}", *found.lines, "data:"]
    lines += [
        f"  calibration: {_relative(calibration, out.parent)}",
        f"  evaluation: {_relative(evaluation, out.parent)}",
    ]
    lines += [f"  metric: {metric}  # {_metric_note(metric, labelled)}"]
    if kind == "images" and found.kind == "onnx":
        lines += _preprocess_lines(found.specs[0])
    if kind == "images" and labelled:
        lines += _classes_lines(calibration)
    if kind == "text" and found.kind == "onnx":
        if found.tokenizer is None:
            raise InputError(
                f"init: '{model.name}' has no tokenizer.json beside it; text data needs one (data.tokenizer)"
            )
        lines += [f"  tokenizer: {_relative(found.tokenizer, out.parent)}  # the folder holding tokenizer.json"]
    lines += [
        "# Everything else is the default: auto mode picks the scheme, ranges and fallback within the target's rules,",
        "# and the gate allows a 1-point drop (gate.max_drop). See 'python -m deploy_opt build --help'.",
    ]
    write_text(out, "\n".join(lines) + "\n")
    return StarterConfig(out, found.kind, kind, labelled, metric)


def _inspect_model(model: Path, base: Path) -> _Model:
    if model.is_dir() and (model / "config.json").is_file():
        hf = read_hf_config(model)
        task = _hf_task(hf)
        specs = hf_inputs(task, hf)
        lines = ["model:", f"  hf: {_relative(model, base)}  # a Hugging Face folder, loaded from disk only"]
        lines += [f"  task: {task}  # from its architecture {hf.get('architectures')}; one of {', '.join(TASKS)}"]
        return _Model(lines, "hf", specs, None, task, model)
    if model.suffix.lower() != ".onnx" or not model.is_file():
        raise InputError(f"init: '{model}' is neither an .onnx file nor a Hugging Face folder (with config.json)")
    proto = read_onnx_graph(model)
    specs = input_specs_from_onnx(proto)
    lines = ["model:", f"  onnx: {_relative(model, base)}", "  inputs:  # read from the file; named dims are dynamic"]
    lines += [f"    - {{name: {s.name}, shape: {list(s.shape)}, dtype: {s.dtype}}}" for s in specs]
    dims = proto.graph.output[0].type.tensor_type.shape.dim if proto.graph.output else []
    shape = tuple(d.dim_value if d.dim_value > 0 else (d.dim_param or "?") for d in dims)
    tokenizer = model.parent if (model.parent / "tokenizer.json").is_file() else None
    return _Model(lines, "onnx", specs, shape or None, None, tokenizer, len(proto.graph.output))


def _hf_task(hf: dict) -> str:
    architectures = " ".join(hf.get("architectures") or [])
    for suffix, task in (
        ("ForSequenceClassification", "text-classification"),
        ("ForImageClassification", "image-classification"),
        ("ForObjectDetection", "object-detection"),
    ):
        if suffix in architectures:
            return task
    return "image-classification" if "image_size" in hf else "feature-extraction"


def _splits(data: list[Path]) -> tuple[Path, Path]:
    for path in data:
        if not path.exists():
            raise InputError(f"init: data '{path}' does not exist")
        if not path.is_dir():
            regular_input(path, "init: data")  # a FIFO or a device would block or never end
    if len(data) == 2:
        if os.path.samefile(data[0], data[1]):
            raise InputError(
                f"init: '{data[1]}' is given for both calibration and evaluation; calibrating on the evaluation "
                "samples hides accuracy loss; fix: pass two different files (or a folder holding both splits)"
            )
        return data[0], data[1]
    if len(data) != 1 or not data[0].is_dir():
        raise InputError("init: give DATA as a folder holding calibration/ and evaluation/ splits, or two paths")
    members = {p.stem.lower(): p for p in sorted(data[0].iterdir()) if not p.name.startswith(".")}
    calibration = next((members[n] for n in CALIBRATION_NAMES if n in members), None)
    evaluation = next((members[n] for n in EVALUATION_NAMES if n in members), None)
    if calibration is None or evaluation is None:
        raise InputError(
            f"init: '{data[0]}' holds no calibration and evaluation splits (named {'/'.join(CALIBRATION_NAMES)} and "
            f"{'/'.join(EVALUATION_NAMES)}); fix: split it so, or pass the evaluation data as a second path"
        )
    return calibration, evaluation


def _data_kind(path: Path) -> tuple[str, bool]:
    """The source's type and whether it carries labels."""
    suffix = path.suffix.lower()
    if suffix in ARRAY_SUFFIXES:
        if suffix == ".npy":
            return "arrays", False
        with NpzReader(path, "init: data") as loaded:
            return "arrays", any(k in loaded.files for k in LABEL_KEYS)
    if suffix in TEXT_SUFFIXES:
        return "text", read_texts(path, "init").labels is not None
    if path.is_dir() and (path / "dataset_info.json").is_file():  # a datasets split written with save_to_disk
        features = json.loads((path / "dataset_info.json").read_text(encoding="utf-8")).get("features") or {}
        return "dataset", any(name in features for name in LABEL_KEYS)
    if path.is_dir():
        return "images", image_files(path, (), "init")[1] is not None
    raise InputError(f"init: data '{path}' is not an .npy/.npz, .txt/.jsonl or an image folder")


def _metric(model: _Model, labelled: bool) -> str:
    if labelled:
        return "top1"
    if model.task == "feature-extraction":
        return "cosine"
    if model.task in ("text-classification", "image-classification"):
        return "top1"
    shape = model.output_shape or ()
    # one output only: a PicoDet layout detector's eight [1, anchors, 10 | 32] score and box-distribution
    # outputs per level are no YOLO head, and detection_f1 cannot decode them
    if (
        model.outputs == 1
        and len(shape) == 3
        and isinstance(shape[1], int)
        and isinstance(shape[2], int)
        and 5 <= min(shape[1:]) <= 100
    ):
        return "detection_f1"  # [batch, 4 + classes, anchors]: a YOLO head
    return "top1" if len(shape) == 2 else "cosine"


def _metric_note(metric: str, labelled: bool) -> str:
    if labelled:
        return "accuracy against the data's labels, in points"
    return {
        "top1": "no labels: agreement with the FP32 model's arg-max, in points",
        "cosine": "no labels: cosine similarity to the FP32 output x 100",
        "detection_f1": "no labels: F1 of the INT8 detections against the FP32 model's, in points",
    }[metric]


def _preprocess_lines(spec: InputSpec) -> list[str]:
    channels_first = len(spec.shape) == 4 and spec.shape[1] in (1, 3)
    count = spec.shape[1] if channels_first else spec.shape[-1]
    fixed = len(spec.shape) == 4 and all(
        isinstance(d, int) for d in (spec.shape[2:] if channels_first else spec.shape[1:3])
    )
    lines = [
        "  preprocess:  # how each image becomes the input tensor: check it against how the model was trained",
        f"    layout: {'NCHW' if channels_first else 'NHWC'}",
        f"    channels: {'L' if count == 1 else 'RGB'}  # BGR for models trained on OpenCV-loaded images",
        "    scale: 0.00392156862745098  # 1/255: pixels to [0, 1]",
        f"    mean: {[0.0] * (1 if count == 1 else 3)}  # ImageNet: [0.485, 0.456, 0.406]",
        f"    std: {[1.0] * (1 if count == 1 else 3)}  # ImageNet: [0.229, 0.224, 0.225]",
    ]
    if not fixed:
        lines += [
            "    resize: [256]  # the input's height and width are dynamic: the short side to resize to",
            "    crop: [224, 224]",
        ]
    else:
        lines += ["    # resize: [256]  # uncomment to resize the short side, then centre-crop to the input's size"]
    return lines


def _classes_lines(folder: Path) -> list[str]:
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if all(re.fullmatch(r"\d+", n) for n in names):
        names = sorted(names, key=int)  # numeric folder names are class indices in numeric order
    return [f"  classes: {json.dumps(names)}  # class folders in class-index order: the model's output order"]


def _run_name(model: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", model.stem if model.is_file() else model.name).strip("-.") or "model"
    return stem[:64]


def _relative(path: Path, base: Path) -> str:
    return json.dumps(os.path.relpath(path.resolve(), base.resolve()))
