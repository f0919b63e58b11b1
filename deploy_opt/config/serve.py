"""The ``serve:`` section: lmdeploy api_server settings, set by a profile or an LLM config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ServeConfig:
    """lmdeploy api_server settings (a profile's ``serve:`` section can set them)."""

    port: int = 23333
    tp: int = 1
    # auto: TurboMind when lmdeploy 0.18 lets it read the checkpoint (awq/gptq at group 128; gptq symmetric without
    # act-order), else the PyTorch engine (awq only); neither is an error naming what to re-quantize with.
    backend: Literal["auto", "turbomind", "pytorch"] = "auto"
    session_len: int | None = None
    ready_timeout_s: int = 600
