"""The settings one auto-mode trial quantizes with, and what the deploy targets allow of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from deploy_opt.config.build import BuildConfig

SCHEMES = ("asymmetric", "symmetric")


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: placement, activation scheme, SmoothQuant α and the nodes kept float."""

    placement: str  # "inputs" (Q/DQ only into quantized nodes) or "outputs" (ORT's default)
    activations: str
    smoothing_alpha: float | None = None
    excluded: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """A short name for logs and the summary's search table."""
        parts = [self.placement, self.activations[:4]]
        if self.smoothing_alpha is not None:
            parts.append(f"sq{self.smoothing_alpha:g}")
        if self.excluded:
            parts.append(f"-{len(self.excluded)} float")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return {
            "placement": self.placement,
            "activations": self.activations,
            "smoothing_alpha": self.smoothing_alpha,
            "excluded": list(self.excluded),
        }


def allowed_schemes(targets: tuple[str, ...], preferred: str) -> tuple[str, ...]:
    """The activation schemes every target accepts, the profile's first: TensorRT takes only symmetric."""
    if "tensorrt" in targets:
        return ("symmetric",)
    return (preferred, *(s for s in SCHEMES if s != preferred))


def configured(config: BuildConfig, candidate: Candidate) -> BuildConfig:
    """The build config that quantizes exactly as ``candidate`` says (manual mode, no further fallback)."""
    quant = dataclasses.replace(
        config.quantization,
        mode="manual",
        quantize_outputs=candidate.placement == "outputs",
        activations=candidate.activations,
        smoothing="none" if candidate.smoothing_alpha is None else "smoothquant",
        smoothing_alpha=candidate.smoothing_alpha if candidate.smoothing_alpha is not None else 0.5,
        exclude_nodes=candidate.excluded,
        fallback="none",
    )
    return dataclasses.replace(config, quantization=quant)
