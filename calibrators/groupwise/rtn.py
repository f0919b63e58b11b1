"""Group-wise integer weight quantization shared by GPTQ, AWQ and round-to-nearest (RTN).

A Linear weight W [out, in] is cut along ``in`` into groups of ``group_size`` columns (``-1``: one group, i.e.
per output channel). Each (group, output row) gets a scale and an integer zero point; a code is
``q = clamp(round(w / scale) + zero, 0, 2**bits - 1)`` and dequantizes to ``(q - zero) * scale``.

Two ways to choose (scale, zero) per group, each matching the tool whose checkpoints we write:

- ``gptq`` (AutoGPTQ ``Quantizer.find_params``, also llm-compressor's min-max observer): the range always
  includes 0; symmetric uses ``scale = 2·max|w| / (2**bits - 1)`` and the fixed zero ``2**(bits-1)``.
- ``awq`` (AutoAWQ ``pseudo_quantize_tensor``): asymmetric over [min, max] of the group without forcing 0 in,
  ``zero = clamp(-round(min / scale), 0, maxq)``.

Codes are unsigned (0..2**bits-1) with a zero point, the layout both AutoGPTQ and AutoAWQ pack.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dopt_common.errors import ConfigError

CANDIDATE_GROUP_SIZES = (32, 64, 128, 256)


@dataclass(frozen=True)
class QuantizedWeight:
    """Integer codes and group parameters of one Linear weight; ``dequantize()`` gives the float weight back.

    ``qweight`` [out, in] codes in 0..2**bits-1; ``scales`` [groups, out] float32; ``zeros`` [groups, out]
    int32; ``g_idx`` [in] int32, the group of each input column (not monotonic after act-order).
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    bits: int
    group_size: int  # -1: one group per output channel
    sym: bool

    @property
    def shape(self) -> tuple[int, int]:
        """[out_features, in_features] of the weight."""
        return tuple(self.qweight.shape)  # type: ignore[return-value]

    @property
    def groups(self) -> int:
        """Number of groups along the input dimension."""
        return int(self.scales.shape[0])

    @property
    def act_order(self) -> bool:
        """True when columns were quantized out of order (g_idx is not column // group_size)."""
        return not torch.equal(self.g_idx, sequential_g_idx(self.shape[1], self.group_size).to(self.g_idx.device))

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] these codes stand for."""
        g = self.g_idx.long()
        scales = self.scales.float()[g].t()  # [out, in]
        zeros = self.zeros.float()[g].t()
        return (self.qweight.float() - zeros) * scales


def sequential_g_idx(in_features: int, group_size: int) -> torch.Tensor:
    """g_idx without act-order: column j belongs to group j // group_size."""
    size = in_features if group_size == -1 else group_size
    return (torch.arange(in_features) // size).to(torch.int32)


def valid_group_sizes(in_features: int) -> list[int]:
    """The usual group sizes that divide ``in_features``, then -1 (per channel), for error messages."""
    return [g for g in CANDIDATE_GROUP_SIZES if in_features % g == 0] + [-1]


def check_group_size(name: str, in_features: int, group_size: int) -> None:
    """Raise ConfigError when ``group_size`` does not divide the layer's input features."""
    if group_size == -1:
        return
    if group_size <= 0 or in_features % group_size != 0:
        choices = ", ".join(str(g) for g in valid_group_sizes(in_features))
        raise ConfigError(
            f"group_size {group_size} does not divide {name} (in_features {in_features}); use one of {choices}"
        )


def check_bits(bits: int) -> None:
    """Raise ConfigError for a bit width the packers do not support."""
    if bits not in (2, 4, 8):
        raise ConfigError(f"bits {bits} is not supported; use 4 (W4A16), or 2 or 8")


def compute_qparams(w: torch.Tensor, bits: int, sym: bool, *, style: str = "gptq") -> tuple[torch.Tensor, torch.Tensor]:
    """Scale [rows] and integer zero [rows] for each row of ``w`` [rows, cols] (one group per row)."""
    maxq = 2**bits - 1
    w = w.float()
    if style == "awq" and not sym:
        xmax = w.amax(dim=1)
        xmin = w.amin(dim=1)
        scale = (xmax - xmin).clamp(min=1e-5) / maxq
        zero = (-torch.round(xmin / scale)).clamp(0, maxq)
        return scale, zero
    zeros = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    xmin = torch.minimum(w.amin(dim=1), zeros)
    xmax = torch.maximum(w.amax(dim=1), zeros)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, -torch.ones_like(xmin), xmin)
    xmax = torch.where(empty, torch.ones_like(xmax), xmax)
    scale = (xmax - xmin) / maxq
    if sym:
        zero = torch.full_like(scale, (maxq + 1) / 2)
    else:
        zero = torch.round(-xmin / scale)
    return scale, zero


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes of ``w`` [rows, cols] with per-row ``scale`` and ``zero`` [rows] (float tensor of ints)."""
    maxq = 2**bits - 1
    return torch.clamp(torch.round(w / scale[:, None]) + zero[:, None], 0, maxq)


def fake_quantize(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Quantize then dequantize ``w`` [rows, cols] with per-row parameters."""
    return (quantize_codes(w, scale, zero, bits) - zero[:, None]) * scale[:, None]


def fake_quantize_groups(
    w: torch.Tensor, bits: int, group_size: int, sym: bool, *, style: str = "gptq"
) -> torch.Tensor:
    """RTN quantize-dequantize of ``w`` [out, in] group by group (parameters from the weight itself)."""
    out_features, in_features = w.shape
    size = in_features if group_size == -1 else group_size
    grouped = w.reshape(out_features * (in_features // size), size)
    scale, zero = compute_qparams(grouped, bits, sym, style=style)
    return fake_quantize(grouped, scale, zero, bits).reshape(out_features, in_features)


def rtn_quantize(
    weight: torch.Tensor, bits: int = 4, group_size: int = 128, sym: bool = True, *, style: str = "gptq"
) -> QuantizedWeight:
    """Round-to-nearest group quantization of ``weight`` [out, in] (no calibration data)."""
    check_bits(bits)
    out_features, in_features = weight.shape
    check_group_size("weight", in_features, group_size)
    size = in_features if group_size == -1 else group_size
    groups = in_features // size
    w = weight.detach().float().reshape(out_features, groups, size).transpose(0, 1).reshape(groups * out_features, size)
    scale, zero = compute_qparams(w, bits, sym, style=style)
    codes = quantize_codes(w, scale, zero, bits)
    codes = codes.reshape(groups, out_features, size).transpose(0, 1).reshape(out_features, in_features)
    return QuantizedWeight(
        qweight=codes.to(torch.int32),
        scales=scale.reshape(groups, out_features).contiguous(),
        zeros=zero.reshape(groups, out_features).to(torch.int32).contiguous(),
        g_idx=sequential_g_idx(in_features, group_size),
        bits=bits,
        group_size=group_size,
        sym=sym,
    )


def output_error(weight: torch.Tensor, approx: torch.Tensor, hessian: torch.Tensor) -> float:
    """Relative output MSE ||X(W-Wq)^T||² / ||XW^T||² computed from the Gram matrix H ∝ X^T X.

    The products are float32 matmuls (a float64 einsum took as long as a forward pass of the layer on a CPU);
    the sums are float64."""
    h, weight = hessian.float(), weight.float()
    delta = weight - approx.float()
    num = ((delta @ h) * delta).double().sum()
    den = ((weight @ h) * weight).double().sum()
    return float(num / den) if float(den) > 0 else 0.0


def weight_error(weight: torch.Tensor, approx: torch.Tensor) -> float:
    """Relative weight error ||W - Wq|| / ||W||."""
    norm = float(weight.double().norm())
    return float((weight.double() - approx.double()).norm()) / norm if norm > 0 else 0.0
