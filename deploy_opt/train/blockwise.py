"""Block-wise 8-bit codes for optimizer state: a flat tensor cut into blocks, one fp32 scale per block.

Signed state (AdamW's first moment, Lion's and SGD's momentum) uses a symmetric linear int8 code:
``scale = absmax / 127``, ``code = round(x / scale)``, so a round trip is off by at most ``scale / 2``.

The second moment ``v`` is non-negative and spans many decades inside one block (14 to 37 decades measured); what
matters is the update ``m / (sqrt(v) + eps)``, which blows up wherever a small ``v`` rounds to zero under a
nonzero ``m``. Three unsigned codes, uint8 with one fp32 scale per block:

- ``linear``: ``round(v / (max / 255))``; everything under max/510 becomes 0;
- ``sqrt``: ``round(sqrt(v) / (sqrt(max) / 255))``; under ~4e-6 of the max becomes 0;
- ``dynamic`` (the default): bitsandbytes' unsigned dynamic map, the nearest of 256 levels x block max: 0, 1, and
  7 decades below 1 with 2, 4, ..., 128 evenly spaced levels per decade; under ~1.6e-7 of the max becomes 0.

Measured by ``benchmarks/train/state_codes.py`` on AdamW moments after 100 steps on the sklearn digits (block
2048, tensors >= 4096 elements): relative L2 error of the update with ``m`` in int8 too, as ``Int8AdamW`` reads
the state (code 0 as half a step, see ``dequantize_unsigned``), and the share of elements whose update moves by
more than 10 % of its rms:

==========================  ===============  ===============  ===============
model                       dynamic          sqrt             linear
==========================  ===============  ===============  ===============
demo MLP from scratch       0.147 / 2.6 %    0.153 / 2.8 %    0.348 / 6.1 %
demo MLP fine-tuned         0.479 / 3.9 %    0.620 / 4.2 %    0.886 / 7.0 %
2-layer transformer         0.160 / 1.4 %    0.157 / 1.6 %    0.226 / 8.0 %
==========================  ===============  ===============  ===============

Reading code 0 as 0 instead, the error is 6 to 16,000 even with ``m`` exact (``m / eps``).

``dynamic`` is the default: it keeps the most small values (nonzero ``v`` decoded to 0: 19.5 / 10.6 / 1.5 %
vs 26.0 / 14.2 / 1.9 % for ``sqrt``) and gives the smallest update error on two models of three and the
fewest far-off elements on all three. ``sqrt`` is the cheaper code (a half to a third of the step time, eager
or compiled; see the benchmark) at a slightly larger error.

Every scale is floored at ``SCALE_FLOOR`` (1e-12): an all-zero or all-tiny block quantizes to zero codes and
dequantizes to exact zeros; no division by zero, no NaN or Inf. All work is vectorised over blocks (a tensor
whose size is not a multiple of the block size is handled as full blocks plus one shorter tail block).
"""

from __future__ import annotations

import dataclasses
import logging
from functools import lru_cache

import torch

from deploy_opt.train import dynamic_code
from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)

MIN_BLOCK_SIZE, MAX_BLOCK_SIZE, DEFAULT_BLOCK_SIZE = 64, 8192, 2048
SCALE_FLOOR = 1e-12
SECOND_MOMENT_CODES = ("dynamic", "sqrt", "linear")
DEFAULT_SECOND_MOMENT_CODE = "dynamic"


def check_block_size(block_size: int) -> int:
    """Return ``block_size`` if it is an int in 64..8192, else raise ``ConfigError``."""
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise ConfigError(f"block_size must be an integer, got {block_size!r}; use e.g. 2048")
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise ConfigError(
            f"block_size {block_size} is outside {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE}; use e.g. {DEFAULT_BLOCK_SIZE}"
        )
    return block_size


def check_second_moment_code(code: str) -> str:
    """Return ``code`` if it is a known second-moment code, else raise ``ConfigError``."""
    if code not in SECOND_MOMENT_CODES:
        raise ConfigError(f"second_moment_code {code!r} is not one of {', '.join(SECOND_MOMENT_CODES)}")
    return code


def block_count(numel: int, block_size: int) -> int:
    """How many blocks (and scales) a tensor of ``numel`` elements needs."""
    return -(-numel // block_size)


@lru_cache(maxsize=8)
def _dynamic_map_cpu() -> torch.Tensor:
    # bitsandbytes' create_dynamic_map(signed=False, max_exponent_bits=7, total_bits=8): decade i (i = 0..6)
    # covers [10^(i-7), 10^(i-6)] of the block max with 2^(i+1) evenly spaced levels; plus 0 and 1. Computed
    # in float32 by dynamic_code.level, so a compiled kernel decoding arithmetically gives the same bits.
    table = dynamic_code.level(torch.arange(256, dtype=torch.int32))
    if not bool((table.diff() > 0).all()):
        raise RuntimeError("dynamic map levels are not increasing")  # a bug here, not user input
    return table


@dataclasses.dataclass(frozen=True)
class DynamicTables:
    """The dynamic code's lookup tables on one device (shared; do not modify).

    ``levels[i]`` is what code i means; ``levels_read`` the same with code 0 read as half the first level.
    Eager encoding cuts [2^-24, 1] into buckets by the float's exponent and top 8 mantissa bits (0.4 % wide,
    narrower than the closest two levels, 0.7 % apart): ``first[k]`` is the code of bucket k's lower edge and
    ``upper[c]`` the largest float that ``dynamic_code.encode`` gives code c or less; a value moves up one code
    if it passes that. Two lookups give the arithmetic encoder's codes (which compiled kernels run) with a few
    eager operations instead of its thirty.
    """

    levels: torch.Tensor
    levels_read: torch.Tensor
    first: torch.Tensor
    upper: torch.Tensor


_MANTISSA_BITS_KEPT = 8
_BUCKET_SHIFT = 23 - _MANTISSA_BITS_KEPT
_BUCKET_LOW = int(torch.tensor(2.0**-24).view(torch.int32)) >> _BUCKET_SHIFT
_BUCKET_COUNT = (int(torch.tensor(1.0).view(torch.int32)) >> _BUCKET_SHIFT) - _BUCKET_LOW + 1


def _encoder_thresholds() -> torch.Tensor:
    """For codes 0..254, the largest float32 in [0, 1] that ``dynamic_code.encode`` (monotonic) maps to it or less."""
    codes = torch.arange(255, dtype=torch.float32)
    low = torch.zeros(255, dtype=torch.int32)  # bit patterns: encode(low) <= code < encode(high)
    high = torch.full((255,), int(torch.tensor(1.0).view(torch.int32)), dtype=torch.int32)
    while bool((high - low > 1).any()):
        middle = low + (high - low) // 2
        below = dynamic_code.encode(middle.view(torch.float32)) <= codes
        low, high = torch.where(below, middle, low), torch.where(below, high, middle)
    return low.view(torch.float32)


@lru_cache(maxsize=8)
def dynamic_tables(device: torch.device | str = "cpu") -> DynamicTables:
    """The dynamic code's tables on ``device`` (cached)."""
    levels = _dynamic_map_cpu()
    upper = _encoder_thresholds()
    edges = ((torch.arange(_BUCKET_COUNT + 1, dtype=torch.int32) + _BUCKET_LOW) << _BUCKET_SHIFT).view(torch.float32)
    below = torch.searchsorted(upper, edges, right=False)  # how many thresholds lie strictly under each edge
    if int(below.diff().max()) > 1:
        raise RuntimeError("dynamic code buckets hold more than one threshold")  # a bug here, not user input
    half = levels.clone()
    half[0] = dynamic_code.HALF_FIRST
    upper = torch.cat([upper, torch.tensor([float("inf")])])
    device = torch.device(device)
    return DynamicTables(levels.to(device), half.to(device), below[:-1].int().to(device), upper.to(device))


def dynamic_map(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 256 sorted levels in [0, 1] of the unsigned dynamic code (level i is what code i means)."""
    return dynamic_tables(device).levels.clone()


def block_parts(flat: torch.Tensor, block_size: int) -> list[torch.Tensor]:
    """Views of ``flat`` as [full_blocks, block_size] and, if there is a remainder, [1, tail]."""
    full = flat.numel() // block_size * block_size
    parts = []
    if full:
        parts.append(flat[:full].view(-1, block_size))
    if full < flat.numel():
        parts.append(flat[full:].view(1, -1))
    return parts


def _block_absmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    return torch.cat([part.abs().amax(dim=1) for part in block_parts(x, block_size)])


def _empty_state(x: torch.Tensor, block_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    codes = torch.empty(x.numel(), dtype=dtype, device=x.device)
    scales = torch.empty(block_count(x.numel(), block_size), dtype=torch.float32, device=x.device)
    return codes, scales


def quantize_signed(
    x: torch.Tensor, block_size: int, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear symmetric int8 codes of ``x`` (flattened) and fp32 scales ``absmax / 127`` per block."""
    flat = x.detach().reshape(-1).float()
    codes, scales = out if out is not None else _empty_state(flat, block_size, torch.int8)
    scales.copy_(_block_absmax(flat, block_size).div_(127.0).clamp_min_(SCALE_FLOOR))
    for part, s, c in zip(
        block_parts(flat, block_size),
        scale_parts(scales, flat.numel(), block_size),
        block_parts(codes, block_size),
        strict=True,
    ):
        c.copy_(torch.div(part, s.unsqueeze(1)).round_().clamp_(-127, 127))
    return codes, scales


def dequantize_signed(codes: torch.Tensor, scales: torch.Tensor, block_size: int) -> torch.Tensor:
    """The fp32 flat tensor that int8 ``codes`` and per-block ``scales`` stand for."""
    out = codes.float()
    for part, s in zip(block_parts(out, block_size), scale_parts(scales, out.numel(), block_size), strict=True):
        part.mul_(s.unsqueeze(1))
    return out


def scale_parts(scales: torch.Tensor, numel: int, block_size: int) -> list[torch.Tensor]:
    """The per-block ``scales`` of a tensor of ``numel`` elements, split as ``block_parts`` splits the tensor."""
    full = numel // block_size
    parts = []
    if full:
        parts.append(scales[:full])
    if full * block_size < numel:
        parts.append(scales[full:])
    return parts


def quantize_unsigned(
    x: torch.Tensor,
    block_size: int,
    code: str = DEFAULT_SECOND_MOMENT_CODE,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 codes and fp32 per-block scales of non-negative ``x`` (negatives are clamped to 0) in ``code``.

    Scale meaning: ``linear`` max/255, ``sqrt`` sqrt(max)/255, ``dynamic`` the block max itself.
    """
    check_second_moment_code(code)
    flat = x.detach().reshape(-1).float().clamp_min(0.0)
    if code == "sqrt":
        flat = flat.sqrt_()
    codes, scales = out if out is not None else _empty_state(flat, block_size, torch.uint8)
    top = _block_absmax(flat, block_size)
    scales.copy_((top if code == "dynamic" else top.div_(255.0)).clamp_min_(SCALE_FLOOR))
    for part, s, c in zip(
        block_parts(flat, block_size),
        scale_parts(scales, flat.numel(), block_size),
        block_parts(codes, block_size),
        strict=True,
    ):
        y = torch.div(part, s.unsqueeze(1))
        c.copy_(encode_dynamic(y.clamp_(max=1.0)) if code == "dynamic" else y.round_().clamp_(0, 255))
    return codes, scales


def encode_dynamic(y: torch.Tensor, tables: DynamicTables | None = None) -> torch.Tensor:
    """The code of each ``y`` in [0, 1] that ``dynamic_code.encode`` gives, by two table lookups, as int32.

    The compiled kernels run the arithmetic (a compiled lookup is a scalar gather); eagerly, this is a few
    operations instead of thirty, and a binary search (``torch.bucketize``) would take ~40 ns per element.
    """
    tables = dynamic_tables(y.device) if tables is None else tables
    flat = y.reshape(-1).contiguous()
    bucket = (flat.view(torch.int32) >> _BUCKET_SHIFT).sub_(_BUCKET_LOW).clamp_(0, _BUCKET_COUNT - 1)
    code = tables.first.index_select(0, bucket)
    return code.add_(tables.upper.index_select(0, code) < flat).view(y.shape)


def dequantize_unsigned(
    codes: torch.Tensor,
    scales: torch.Tensor,
    block_size: int,
    code: str = DEFAULT_SECOND_MOMENT_CODE,
    zero_as_half_step: bool = False,
) -> torch.Tensor:
    """The fp32 flat tensor that uint8 ``codes`` and per-block ``scales`` stand for in ``code``.

    ``zero_as_half_step`` reads code 0 as half the first nonzero level, the upper end of what rounds to zero.
    The optimizers read ``v`` that way: a small ``v`` rounded to 0 under a nonzero ``m`` would turn the update
    ``m / (sqrt(v) + eps)`` into ``m / eps``; read as half a step it stays bounded (and an exact zero ``v``
    has a zero ``m``, so its update stays zero).
    """
    check_second_moment_code(code)
    if code == "dynamic":
        tables = dynamic_tables(codes.device)
        out = (tables.levels_read if zero_as_half_step else tables.levels).index_select(0, codes.int())
    else:
        out = codes.float()
        if zero_as_half_step:
            out.clamp_(min=0.5)
    for part, s in zip(block_parts(out, block_size), scale_parts(scales, out.numel(), block_size), strict=True):
        part.mul_(s.unsqueeze(1))
    return out.square_() if code == "sqrt" else out


def quantize(
    x: torch.Tensor, block_size: int, code: str, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of ``x`` in ``code``: ``signed`` (linear int8) or one of ``SECOND_MOMENT_CODES``."""
    if code == "signed":
        return quantize_signed(x, block_size, out)
    return quantize_unsigned(x, block_size, code, out)


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, block_size: int, code: str, zero_as_half_step: bool = False
) -> torch.Tensor:
    """Inverse of ``quantize``: the fp32 flat tensor (``zero_as_half_step``: see ``dequantize_unsigned``)."""
    if code == "signed":
        return dequantize_signed(codes, scales, block_size)
    return dequantize_unsigned(codes, scales, block_size, code, zero_as_half_step)
