"""The ``serve:`` section: lmdeploy api_server settings, set by a profile or an LLM config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dopt_common.errors import ConfigError


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
    # lmdeploy's --quant-policy 8|4: the KV cache in int8 or int4 (check it first: quantize-llm --kv-cache int8)
    kv_cache: Literal["none", "int8", "int4"] = "none"

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"serve.port {self.port} is not a TCP port; use 1-65535 (e.g. --port 23333)")
        if self.tp < 1:
            raise ConfigError(f"serve.tp {self.tp}: tensor parallelism needs at least 1 GPU; use --tp 1 or more")
        if self.session_len is not None and self.session_len < 1:
            raise ConfigError(f"serve.session_len {self.session_len} must be >= 1, or unset")
        if self.ready_timeout_s < 1:
            raise ConfigError(f"serve.ready_timeout_s {self.ready_timeout_s} must be >= 1")
