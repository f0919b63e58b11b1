"""Fake quantization in torch: the straight-through estimator, and LSQ's learnable step size.

``fake_quantize`` is QuantizeLinear followed by DequantizeLinear, ``(clamp(round(x / s) + z, qmin, qmax) - z) * s``,
with the gradients of Learned Step Size Quantization (Esser et al., 2020):

- with respect to ``x``: 1 where ``x`` falls inside the representable range (rounding passes the gradient
  straight through), 0 where it is clipped;
- with respect to ``s``: ``round(x / s) - x / s`` inside the range, ``qmin - z`` or ``qmax - z`` outside, scaled
  by ``g = 1 / sqrt(N * qmax)`` (``N``: elements per sample) so the step size learns at the weights' pace.

The zero point stays the integer the PTQ scales gave, so zero stays exactly representable. Weights are quantized
per channel with the scale their current absmax gives (symmetric, ±levels), as the writer will quantize them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# uint8 / int8 code ranges of an activation (QuantizeLinear saturates to the type's full range).
CODE_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
_TINY = float(np.finfo(np.float32).tiny)


def round_ste(x: Any) -> Any:
    """``round(x)`` whose gradient is the identity (the straight-through estimator)."""
    import torch

    return (torch.round(x) - x).detach() + x


def scale_gradient(value: Any, factor: float) -> Any:
    """``value`` unchanged, with its gradient multiplied by ``factor``."""
    scaled = value * factor
    return (value - scaled).detach() + scaled


def fake_quantize(x: Any, scale: Any, zero_point: int, qmin: int, qmax: int, grad_factor: float = 1.0) -> Any:
    """Quantize-dequantize ``x`` with step ``scale`` (a 0-d tensor; learnable) and an integer zero point.

    torch's fused LSQ kernel (one pass forward, one backward; rounding half to even, as QuantizeLinear does);
    :func:`fake_quantize_reference` is the same maths in plain ops.
    """
    import torch

    if x.dtype != torch.float32:  # the fused kernel is float32 only
        return fake_quantize_reference(x, scale, zero_point, qmin, qmax, grad_factor)
    zero = torch.tensor([float(zero_point)], dtype=x.dtype)
    return torch._fake_quantize_learnable_per_tensor_affine(
        x, scale.reshape(1).to(x.dtype), zero, qmin, qmax, grad_factor
    )


def fake_quantize_reference(x: Any, scale: Any, zero_point: int, qmin: int, qmax: int, grad_factor: float = 1.0) -> Any:
    """:func:`fake_quantize` written out: ``(clamp(round_ste(x / s) + z, qmin, qmax) - z) * s``."""
    import torch

    step = scale_gradient(scale, grad_factor)
    codes = torch.clamp(round_ste(x / step) + zero_point, qmin, qmax)
    return (codes - zero_point) * step


def lsq_factor(x: Any, qmax: int) -> float:
    """LSQ's gradient scale for a tensor like ``x`` (batch axis first): ``1 / sqrt(elements per sample × qmax)``."""
    per_sample = max(1, x.numel() // max(1, x.shape[0] if x.dim() else 1))
    return 1.0 / float(np.sqrt(per_sample * max(qmax, 1)))


def fake_quantize_weight(weight: Any, axis: int | None, levels: int) -> Any:
    """Symmetric per-channel (``axis``) or per-tensor fake quantization at ``±levels``, scale = absmax / levels.

    The scale follows the weight (it is recomputed every call and carries no gradient), so the weight's
    gradient passes straight through: the weight learns values that survive rounding.
    """
    import torch

    if axis is None:
        scale = torch.clamp(weight.detach().abs().amax() / levels, min=_TINY)
        return torch.fake_quantize_per_tensor_affine(weight, float(scale), 0, -levels, levels)
    axis = axis % weight.dim()
    dims = [d for d in range(weight.dim()) if d != axis]
    scale = torch.clamp(weight.detach().abs().amax(dim=dims) / levels, min=_TINY)
    zeros = torch.zeros(scale.shape, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(weight, scale, zeros, axis, -levels, levels)
