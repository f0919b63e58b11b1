"""``model.hf: DIR`` read as config: the task's inputs, outputs, tokenizer and image preprocessing, from the
folder's config.json and preprocessor_config.json (JSON only; build/hf_model.py loads the model itself).

| task | inputs | outputs |
|---|---|---|
| feature-extraction | input_ids, attention_mask[, token_type_ids]: [batch, sequence] int64 | last_hidden_state |
| text-classification | the same | logits |
| image-classification | pixel_values: [batch, channels, height, width] float32 (the config's size) | logits |
| object-detection | pixel_values | logits, pred_boxes |

token_type_ids where the config has a ``type_vocab_size`` (BERT and its kin). ``with_hf_defaults`` fills
``model.inputs``/``outputs``, ``data.tokenizer`` (text tasks) and ``data.preprocess`` (image tasks) where the
config leaves them unset.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.config.data import DataConfig, PreprocessConfig
from deploy_opt.config.model import InputSpec, ModelConfig
from dopt_common.errors import ConfigError, ModelError

TASKS = {  # task -> (transformers auto class, output names)
    "feature-extraction": ("AutoModel", ("last_hidden_state",)),
    "text-classification": ("AutoModelForSequenceClassification", ("logits",)),
    "image-classification": ("AutoModelForImageClassification", ("logits",)),
    "object-detection": ("AutoModelForObjectDetection", ("logits", "pred_boxes")),
}


def hf_folder(base_dir: str, hf: str) -> Path:
    """``model.hf`` as a path (relative to the config's folder), checked to be a transformers folder."""
    folder = Path(base_dir) / hf
    if not (folder / "config.json").is_file():
        raise ConfigError(f"model.hf '{hf}' has no config.json; fix: point it at a transformers model folder")
    return folder


def read_hf_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json."""
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"model.hf: cannot read {folder / 'config.json'} ({exc})") from exc


@dataclass(frozen=True)
class HFDefaults:
    """The model and data sections with what ``model.hf`` implies filled in."""

    model: ModelConfig
    data: DataConfig


def with_hf_defaults(model: ModelConfig, data: DataConfig, base_dir: str) -> HFDefaults:
    """model.inputs/outputs, data.tokenizer and data.preprocess filled from ``model.hf`` where they are unset."""
    if model.hf is None:
        return HFDefaults(model, data)
    folder, task = hf_folder(base_dir, model.hf), str(model.task)
    inputs = model.inputs or hf_inputs(task, read_hf_config(folder))
    model = dataclasses.replace(model, inputs=inputs, outputs=model.outputs or TASKS[task][1])
    if task in ("feature-extraction", "text-classification") and data.tokenizer is None:
        data = dataclasses.replace(data, tokenizer=model.hf)
    if task in ("image-classification", "object-detection") and data.preprocess == PreprocessConfig():
        data = dataclasses.replace(data, preprocess=hf_preprocess(folder))
    return HFDefaults(model, data)


def hf_inputs(task: str, hf_config: dict[str, Any]) -> tuple[InputSpec, ...]:
    """The task's input declarations."""
    if task in ("image-classification", "object-detection"):
        size = hf_config.get("image_size", 224)
        height, width = (size, size) if isinstance(size, int) else (size["height"], size["width"])
        channels = int(hf_config.get("num_channels", 3))
        return (InputSpec("pixel_values", ("batch", channels, height, width), "float32"),)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if hf_config.get("type_vocab_size") else [])
    return tuple(InputSpec(n, ("batch", "sequence"), "int64") for n in names)


def hf_preprocess(folder: Path) -> PreprocessConfig:
    """preprocessor_config.json's rescale, mean/std and sizes as ``data.preprocess`` (defaults when absent)."""
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return PreprocessConfig()
    raw = json.loads(path.read_text(encoding="utf-8"))
    size, crop = raw.get("size") or {}, raw.get("crop_size") or {}
    resize = (size["shortest_edge"],) if "shortest_edge" in size else tuple(size.get(k) for k in ("height", "width"))
    return PreprocessConfig(
        resize=tuple(v for v in resize if v) if raw.get("do_resize", True) else (),
        crop=tuple(crop[k] for k in ("height", "width") if k in crop) if raw.get("do_center_crop") else (),
        scale=float(raw.get("rescale_factor", 1 / 255)) if raw.get("do_rescale", True) else 1.0,
        mean=tuple(raw.get("image_mean", (0.0, 0.0, 0.0))) if raw.get("do_normalize", True) else (0.0,),
        std=tuple(raw.get("image_std", (1.0, 1.0, 1.0))) if raw.get("do_normalize", True) else (1.0,),
    )
