"""The dynamic code as arithmetic (deploy_opt.train.dynamic_code): bitsandbytes' levels, nearest-level encoding,
the eager table lookups giving the arithmetic's codes, and Inductor compiling both to the same bits."""

from __future__ import annotations

import pytest
import torch

from deploy_opt.train import blockwise, dynamic_code

ONE_BITS = int(torch.tensor(1.0).view(torch.int32))


def _bnb_levels() -> torch.Tensor:
    # bitsandbytes' create_dynamic_map(signed=False), written independently: float64 midpoints of linspace bins
    levels = [0.0, 1.0]
    for i in range(7):
        bounds = torch.linspace(0.1, 1.0, 2 ** (i + 1) + 1, dtype=torch.float64)
        levels += ((bounds[:-1] + bounds[1:]) / 2 * 10.0 ** (i - 6)).tolist()
    return torch.tensor(sorted(levels), dtype=torch.float64)


def _around_thresholds() -> torch.Tensor:
    # every float32 within 3 ulps of a code boundary, where rounding decides
    bits = blockwise.dynamic_tables().upper[:-1].view(torch.int32)
    return (bits.unsqueeze(1) + torch.arange(-3, 4, dtype=torch.int32)).reshape(-1).clamp(0, ONE_BITS)


def test_levels_are_bitsandbytes_dynamic_map_to_float32_rounding() -> None:
    levels = dynamic_code.level(torch.arange(256))
    assert levels.dtype == torch.float32 and bool((levels.diff() > 0).all())
    reference = _bnb_levels()
    assert float(((levels.double() - reference).abs() / reference.clamp_min(1e-30)).max()) < 1e-6
    torch.testing.assert_close(blockwise.dynamic_map(), levels, rtol=0, atol=0)  # the table is this function


def test_encode_gives_the_nearest_level_and_inverts_level() -> None:
    codes = torch.arange(256)
    assert torch.equal(dynamic_code.encode(dynamic_code.level(codes)).long(), codes)
    y = torch.cat([torch.rand(200_000) ** 12, torch.rand(100_000), _around_thresholds().view(torch.float32)])
    y = y.clamp(0.0, 1.0)
    levels = dynamic_code.level(codes).double()
    got = dynamic_code.encode(y).long()
    nearest = (y.double().unsqueeze(1) - levels.unsqueeze(0)).abs().min(dim=1).values
    # nearest up to float32 rounding at a midpoint: the chosen level is never farther than the nearest one by
    # more than 1e-4 of the gap between levels there (measured 3.4e-5, in 134 of 302k values)
    gap = torch.cat([levels.diff(), levels.diff()[-1:]])[got]
    assert bool(((levels[got] - y.double()).abs() <= nearest + 1e-4 * gap).all())
    mids = ((levels[1:] + levels[:-1]) / 2).float()
    off = (torch.bucketize(y, mids) - got).abs()
    assert int(off.max()) <= 1 and float(off.float().mean()) < 1e-3


def test_eager_table_lookup_gives_the_arithmetic_codes() -> None:
    """blockwise.encode_dynamic (two lookups) = dynamic_code.encode on every 31st float32 in [0, 1] and at every
    code boundary (all 1.07e9 floats were checked once, by hand: 0 differ)."""
    boundary = _around_thresholds().view(torch.float32)
    assert torch.equal(blockwise.encode_dynamic(boundary).long(), dynamic_code.encode(boundary).long())
    for start in range(0, ONE_BITS + 1, 1 << 26):
        y = torch.arange(start, min(start + (1 << 26), ONE_BITS + 1), 31, dtype=torch.int32).view(torch.float32)
        assert torch.equal(blockwise.encode_dynamic(y).long(), dynamic_code.encode(y).long())


@pytest.mark.slow
def test_inductor_compiles_level_and_encode_to_the_eager_bits() -> None:
    """No FMA contraction or reassociation: the compiled kernels' codes and levels are the eager table's."""
    torch._dynamo.reset()
    compiled_level = torch.compile(lambda c: dynamic_code.level(c, zero=dynamic_code.HALF_FIRST), fullgraph=True)
    compiled_encode = torch.compile(dynamic_code.encode, fullgraph=True)
    codes = torch.arange(256, dtype=torch.uint8).repeat(33)  # longer than a vector, with a tail
    assert torch.equal(compiled_level(codes), blockwise.dynamic_tables().levels_read[codes.long()])
    y = torch.cat([_around_thresholds().view(torch.float32), torch.rand(50_001) ** 10])
    assert torch.equal(compiled_encode(y).long(), blockwise.encode_dynamic(y).long())
