"""The settings one auto-mode trial quantizes with, and what the deploy targets allow of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from deploy_opt.config.setup import QuantSetup

SCHEMES = ("asymmetric", "symmetric")
# "chain" coverage also quantizes the ops between weighted ones that ONNX Runtime's CPU kernels run on integers
# (QLinearAdd/Mul/Sigmoid/Concat/GlobalAveragePool/LeakyRelu; Relu and Clip fold into the Q; data movement keeps
# its input's scale), so a CNN's Conv → activation → Conv runs as one integer chain instead of converting back
# to float at every activation. ORT's own quantize_static quantizes all of these by default.
CHAIN_OPS = (
    "Add",
    "Mul",
    "Sigmoid",
    "GlobalAveragePool",
    "Concat",
    "LeakyRelu",
    "Relu",
    "Clip",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Slice",
    "AveragePool",
    "MaxPool",
)


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: placement, activation scheme, SmoothQuant α and the nodes kept float."""

    placement: str  # "inputs" (Q/DQ only into quantized nodes) or "outputs" (ORT's default)
    activations: str
    smoothing_alpha: float | None = None
    excluded: tuple[str, ...] = ()
    coverage: str = "weighted"  # "weighted": quantization.op_types; "chain": those and CHAIN_OPS
    # accuracy recovery applied to the FP32 graph before quantizing, in order (``autotune.recover``):
    # "cle" (cross-layer equalization), "bias" (empirical bias correction), "adaround" (learned rounding)
    recovery: tuple[str, ...] = ()

    @property
    def dynamic(self) -> bool:
        """ORT's dynamic INT8 (``build/dynamic.py``), not a Q/DQ model: fallback and latency steps do not vary it."""
        return self.placement == "dynamic"

    @property
    def label(self) -> str:
        """A short name for logs and the summary's search table."""
        parts = [self.placement + ("+chain" if self.coverage == "chain" else ""), self.activations[:4]]
        if self.smoothing_alpha is not None:
            parts.append(f"sq{self.smoothing_alpha:g}")
        parts.extend(f"+{method}" for method in self.recovery)
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
            "coverage": self.coverage,
            "recovery": list(self.recovery),
        }

    def op_types(self, configured_types: tuple[str, ...]) -> tuple[str, ...]:
        """The op types this candidate quantizes: the configured ones, and CHAIN_OPS for chain coverage."""
        if self.coverage != "chain":
            return configured_types
        return configured_types + tuple(op for op in CHAIN_OPS if op not in configured_types)


def allowed_schemes(targets: tuple[str, ...], preferred: str) -> tuple[str, ...]:
    """The activation schemes every target accepts, the profile's first: TensorRT takes only symmetric."""
    if "tensorrt" in targets:
        return ("symmetric",)
    return (preferred, *(s for s in SCHEMES if s != preferred))


def allowed_placements(targets: tuple[str, ...], placements: tuple[str, ...]) -> tuple[str, ...]:
    """The placements the targets fuse: TensorRT's guidance (and ModelOpt's ONNX PTQ) quantizes the inputs of
    weighted ops and never their outputs on their own, so a TensorRT target searches "inputs" only."""
    if "tensorrt" in targets:
        return tuple(p for p in placements if p == "inputs")
    return placements


def configured(setup: QuantSetup, candidate: Candidate) -> QuantSetup:
    """The setup that quantizes exactly as ``candidate`` says (manual mode, no further fallback)."""
    quant = dataclasses.replace(
        setup.quantization,
        mode="manual",
        quantize_outputs=candidate.placement == "outputs",
        activations=candidate.activations,
        smoothing="none" if candidate.smoothing_alpha is None else "smoothquant",
        smoothing_alpha=candidate.smoothing_alpha if candidate.smoothing_alpha is not None else 0.5,
        exclude_nodes=candidate.excluded,
        op_types=candidate.op_types(setup.quantization.op_types),
        fallback="none",
    )
    return dataclasses.replace(setup, quantization=quant)
