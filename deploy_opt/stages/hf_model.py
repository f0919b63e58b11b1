"""``model.hf: DIR``: a local Hugging Face transformers folder, loaded for export without a factory.

The folder is loaded with the task's transformers ``AutoModel*`` class from disk only (``local_files_only``: no
hub access) and wrapped so that its forward takes ``model.inputs`` positionally and returns the task's output
tensors (config/hf.py lists them); the build's own exporter then writes it to ONNX (torch.onnx, with the parity
check) with named dynamic axes.
"""

from __future__ import annotations

import logging
from typing import Any

from deploy_opt.config.hf import TASKS, hf_folder
from deploy_opt.config.model import ModelConfig
from dopt_common.deps import require
from dopt_common.errors import ModelError
from dopt_common.weights import check_weight_folder

log = logging.getLogger(__name__)


def load_hf_model(model_cfg: ModelConfig, base_dir: str) -> Any:
    """The folder's model in eval mode, wrapped to take ``model.inputs`` positionally and return ``outputs``;
    ``model_cfg.hf`` is relative to ``base_dir`` (the config's folder)."""
    torch = require("torch", purpose="model.hf")
    transformers = require("transformers", purpose="model.hf", extra="llm")
    folder, task = hf_folder(base_dir, str(model_cfg.hf)), str(model_cfg.task)
    auto = getattr(transformers, TASKS[task][0])
    check_weight_folder(folder)  # a damaged safetensors header or a pickle naming code: one line, nothing run
    from pickle import UnpicklingError

    from safetensors import SafetensorError

    try:
        model = auto.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    except (OSError, ValueError, KeyError, UnpicklingError, SafetensorError) as exc:
        raise ModelError(f"model.hf '{model_cfg.hf}': transformers cannot load it as {task} ({exc})") from exc
    names = [s.name for s in model_cfg.inputs]
    wrapped = _task_model(torch, model, names, list(model_cfg.outputs))
    log.info("model.hf: %s loaded as %s (%s → %s)", folder, task, names, list(model_cfg.outputs))
    return wrapped.eval()


def _task_model(torch: Any, model: Any, names: list[str], outputs: list[str]) -> Any:
    """``model`` behind a forward with named parameters (torch.export matches dynamic shapes to them)."""

    def pick(result: Any) -> Any:
        picked = tuple(result[name] for name in outputs)
        return picked[0] if len(picked) == 1 else picked

    class TextModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return pick(self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **extra))

    class ImageModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return pick(self.model(pixel_values=pixel_values, return_dict=True))

    if names == ["pixel_values"]:
        return ImageModel()
    if names[:2] != ["input_ids", "attention_mask"] or names[2:] not in ([], ["token_type_ids"]):
        raise ModelError(f"model.hf: model.inputs {names} are not input_ids, attention_mask[, token_type_ids]")
    return TextModel()
