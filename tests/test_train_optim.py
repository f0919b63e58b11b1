"""The int8 block-wise optimizer core: codes, convergence against torch, state memory, arguments, fused kernels."""

from __future__ import annotations

import pytest
import torch

from deploy_opt.train import blockwise
from deploy_opt.train.optimizers import Int8AdamW, Int8Lion, Int8SGD, optimizer_state_bytes
from dopt_common.errors import ConfigError

torch.set_num_threads(1)


def _per_element(scales: torch.Tensor, numel: int, block_size: int) -> torch.Tensor:
    return scales.repeat_interleave(block_size)[:numel]


def _spread(numel: int, seed: int = 0) -> torch.Tensor:
    # Magnitudes over 8 decades, different per block, so blocks get very different scales.
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=gen) * torch.logspace(-6, 2, numel)[torch.randperm(numel, generator=gen)]


# --- codes ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [64, 256, 2048])
@pytest.mark.parametrize("numel", [64, 1000, 5000])
def test_signed_round_trip_is_within_half_a_step_per_block(block_size: int, numel: int) -> None:
    x = _spread(numel)
    codes, scales = blockwise.quantize_signed(x, block_size)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float32
    assert scales.numel() == blockwise.block_count(numel, block_size)
    blockmax = torch.stack([b.abs().max() for b in x.split(block_size)])
    torch.testing.assert_close(scales, blockmax / 127)
    err = (x - blockwise.dequantize_signed(codes, scales, block_size)).abs()
    assert (err <= _per_element(scales, numel, block_size) * (0.5 + 1e-5)).all()


def test_dynamic_code_matches_a_brute_force_nearest_level_lookup() -> None:
    v = _spread(5000).square()
    codes, scales = blockwise.quantize_unsigned(v, 2048, "dynamic")
    table = blockwise.dynamic_map()
    y = v / _per_element(scales, v.numel(), 2048)
    nearest = (y.unsqueeze(1) - table.unsqueeze(0)).abs().argmin(dim=1)  # independent reference
    # Ties (y exactly between two levels) may go either way; everything else must agree.
    agree = codes.long() == nearest
    assert agree.float().mean() > 0.999
    assert ((table[codes.long()] - y).abs() <= (table[nearest] - y).abs() + 1e-7).all()


@pytest.mark.parametrize("code", blockwise.SECOND_MOMENT_CODES)
def test_second_moment_round_trip_bound(code: str) -> None:
    v = _spread(5000, seed=1).square()
    codes, scales = blockwise.quantize_unsigned(v, 1024, code)
    assert codes.dtype == torch.uint8
    back = blockwise.dequantize_unsigned(codes, scales, 1024, code)
    step = _per_element(scales, v.numel(), 1024)
    if code == "linear":
        assert ((v - back).abs() <= step * (0.5 + 1e-5)).all()
    elif code == "sqrt":
        assert ((v.sqrt() - back.sqrt()).abs() <= step * (0.5 + 1e-5)).all()
    else:  # half the gap to the neighbouring level, in units of the block max
        table = blockwise.dynamic_map()
        gaps = torch.diff(table)
        half_gap = torch.maximum(torch.cat([gaps[:1], gaps]), torch.cat([gaps, gaps[-1:]])) / 2
        assert ((v - back).abs() <= half_gap[codes.long()] * step * (1 + 1e-5) + 1e-30).all()


def test_dynamic_code_keeps_small_values_that_linear_codes_lose() -> None:
    v = torch.tensor([1.0, 1e-3, 1e-5, 1e-6] * 16)
    rel = {}
    for code in blockwise.SECOND_MOMENT_CODES:
        back = blockwise.dequantize_unsigned(*blockwise.quantize_unsigned(v, 64, code), 64, code)
        rel[code] = ((back - v).abs() / v)[:4]
    assert (rel["dynamic"] < 0.3).all()
    assert rel["linear"][1:].eq(1).all()  # everything under max/510 rounds to zero
    assert rel["sqrt"][3] == 1  # 1e-6 of the max: sqrt is 1e-3 < 0.5/255


@pytest.mark.parametrize("code", blockwise.SECOND_MOMENT_CODES)
def test_a_second_moment_rounded_to_zero_reads_as_half_a_step(code: str) -> None:
    v = torch.tensor([1.0] + [1e-12] * 63)
    codes, scales = blockwise.quantize_unsigned(v, 64, code)
    assert (codes[1:] == 0).all()
    plain = blockwise.dequantize_unsigned(codes, scales, 64, code)
    read = blockwise.dequantize_unsigned(codes, scales, 64, code, zero_as_half_step=True)
    first = blockwise.dequantize_unsigned(torch.ones_like(codes), scales, 64, code)[1]
    assert (plain[1:] == 0).all()
    torch.testing.assert_close(read[1:], torch.full((63,), float(first) / (2 if code != "sqrt" else 4)))
    assert read[0] == plain[0]
    # and reading it back in re-quantizes to code 0: the guard does not creep upwards step after step
    assert (blockwise.quantize_unsigned(read, 64, code)[0][1:] == 0).all()


def test_elements_whose_gradient_is_always_zero_stay_put() -> None:
    weight = torch.nn.Parameter(torch.randn(64, 128))
    start = weight.detach().clone()
    optimizer = Int8AdamW([weight], weight_decay=0.0, min_numel=0, block_size=256)
    mask = torch.rand(64, 128, generator=torch.Generator().manual_seed(0)) < 0.5
    for _ in range(5):
        weight.grad = torch.randn(64, 128) * mask
        optimizer.step()
    assert torch.equal(weight[~mask], start[~mask])
    assert (weight[mask] != start[mask]).float().mean() > 0.95  # the rest: tiny m rounded to 0


@pytest.mark.parametrize("code", ["signed", *blockwise.SECOND_MOMENT_CODES])
def test_zero_tiny_huge_and_mixed_blocks_stay_finite(code: str) -> None:
    sign = 1.0 if code != "signed" else -1.0
    x = torch.cat(
        [
            torch.zeros(64),  # an all-zero block
            torch.full((64,), 1e-30),  # an all-tiny block
            torch.full((64,), 1e30) * sign,  # huge
            torch.tensor([0.0, 1e-30, 1.0, 3e38] * 16),  # mixed, up to fp32's top
            torch.zeros(10),  # a short zero tail block
        ]
    )
    codes, scales = blockwise.quantize(x, 64, code)
    back = blockwise.dequantize(codes, scales, 64, code)
    assert torch.isfinite(scales).all() and torch.isfinite(back).all()
    assert (back[x == 0] == 0).all()
    assert (back[64:128] == 0).all()  # tiny blocks under the scale floor become zeros
    torch.testing.assert_close(back[128:192], x[128:192], rtol=0.02, atol=0)
    assert (scales >= blockwise.SCALE_FLOOR).all()


@pytest.mark.parametrize("bad", [63, 8193, 0, 2048.0, True, "2048"])
def test_block_size_is_validated(bad: object) -> None:
    with pytest.raises(ConfigError, match="block_size"):
        blockwise.check_block_size(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="block_size"):
        Int8AdamW([torch.zeros(4, requires_grad=True)], block_size=bad)  # type: ignore[arg-type]


# --- convergence ---------------------------------------------------------------------------------------------
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return torch.tensor(data.data / 16.0, dtype=torch.float32), torch.tensor(data.target)


def _fit(make: object, steps: int = 100) -> float:
    x, y = _digits()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = make(model.named_parameters())  # type: ignore[operator]
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    return torch.nn.functional.cross_entropy(model(x), y).item()


def _unnamed(cls: type) -> object:
    return lambda named, **kw: cls([p for _, p in named], **kw)


SMALL = {"min_numel": 1024, "block_size": 256}  # so the 64x128 and 128x10 weights get int8 state


@pytest.mark.parametrize(
    ("int8", "fp32", "reference"),
    [
        (
            lambda n: Int8AdamW(n, lr=3e-3, **SMALL),
            lambda n: Int8AdamW(n, lr=3e-3, state="fp32"),
            lambda n: torch.optim.AdamW([p for _, p in n], lr=3e-3, weight_decay=0.01, foreach=True),
        ),
        (
            lambda n: Int8SGD(n, lr=0.05, **SMALL),
            lambda n: Int8SGD(n, lr=0.05, state="fp32"),
            lambda n: torch.optim.SGD([p for _, p in n], lr=0.05, momentum=0.9),
        ),
        (lambda n: Int8Lion(n, lr=2e-3, **SMALL), lambda n: Int8Lion(n, lr=2e-3, state="fp32"), None),
    ],
    ids=["adamw", "sgd", "lion"],
)
def test_optimizers_converge_like_their_fp32_twins(int8: object, fp32: object, reference: object) -> None:
    start = _fit(lambda n: Int8SGD(n, lr=0.0), steps=1)
    loss_int8, loss_fp32 = _fit(int8), _fit(fp32)
    assert loss_int8 < 0.5 * start
    assert abs(loss_int8 - loss_fp32) < 0.03
    if reference is not None:
        assert abs(_fit(reference) - loss_fp32) < 1e-4


# --- memory --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [256, 2048])
@pytest.mark.slow
def test_state_bytes_per_param_on_large_tensors(block_size: int) -> None:
    weight = torch.nn.Parameter(torch.randn(512, 1024))
    optimizer = Int8AdamW([weight], block_size=block_size)
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    measured = optimizer_state_bytes(optimizer)
    expected = 2 * weight.numel() + 2 * 4 * blockwise.block_count(weight.numel(), block_size) + 4
    assert measured["total"] == expected
    assert measured["per_param"] == pytest.approx(2 + 8 / block_size, abs=1e-4)
    assert measured["per_param"] <= 2.05
    torch_bytes = optimizer_state_bytes(_stepped(torch.optim.AdamW([weight])))
    assert torch_bytes["per_param"] == pytest.approx(8, abs=1e-4)


def _stepped(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    optimizer.step()
    return optimizer


# --- arguments and kernels -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"state": "int4"}, "state"),
        ({"lr": -1.0}, "lr"),
        ({"betas": (1.0, 0.9)}, "betas"),
        ({"min_numel": -1}, "min_numel"),
        ({"fp32_warmup_steps": 1.5}, "fp32_warmup_steps"),
        ({"second_moment_code": "log"}, "second_moment_code"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Int8AdamW([torch.zeros(4, requires_grad=True)], **kwargs)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: Int8AdamW(ps, min_numel=0, block_size=256),
        lambda ps: Int8AdamW(ps, min_numel=0, block_size=256, second_moment_code="dynamic"),
        lambda ps: Int8AdamW(ps, min_numel=0, block_size=256, second_moment_code="linear"),
        lambda ps: Int8Lion(ps, min_numel=0, block_size=256, weight_decay=0.1),
        lambda ps: Int8SGD(ps, min_numel=0, block_size=256, weight_decay=0.1),
        lambda ps: Int8SGD(ps, min_numel=0, block_size=256, nesterov=True),
    ],
    ids=["adamw", "adamw-dynamic", "adamw-linear", "lion", "sgd", "sgd-nesterov"],
)
def test_fused_kernels_match_the_unfused_path(make: object) -> None:
    gen = torch.Generator().manual_seed(0)
    # 64 x 130 = 32 whole blocks of 256 and a tail block of 128: the kernel runs on both.
    start = torch.randn(64, 130, generator=gen)
    fused, plain = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opt_fused, opt_plain = make([fused]), make([plain])  # type: ignore[operator]
    opt_fused.use_kernels, opt_plain.use_kernels = True, False
    calls = []
    run_kernel = opt_fused._run_kernel
    opt_fused._run_kernel = lambda param, *rest: calls.append(param.shape) or run_kernel(param, *rest)
    for _ in range(5):
        grad = torch.randn(64, 130, generator=gen) * torch.logspace(-4, 0, 130)
        fused.grad, plain.grad = grad.clone(), grad.clone()
        opt_fused.step()
        opt_plain.step()
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    assert set(calls) == {torch.Size([32, 256]), torch.Size([1, 128])}
    for key, value in opt_plain.state[plain].items():
        other = opt_fused.state[fused][key]
        if value.dtype in (torch.int8, torch.uint8):
            assert (value.int() - other.int()).abs().le(1).all() and (value != other).float().mean() < 1e-3
        else:
            torch.testing.assert_close(other, value, rtol=1e-4, atol=1e-30)


def test_compiled_kernels_trace_without_graph_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    from deploy_opt.train import kernels

    compile_ = torch.compile  # dynamo tracing only (backend "eager"): Inductor's C++ build is for benchmarks
    monkeypatch.setattr(kernels.torch, "compile", lambda fn, options, **kw: compile_(fn, backend="eager", **kw))
    monkeypatch.setattr(kernels, "_COMPILED", {})
    monkeypatch.setattr(kernels, "_FAILED", set())
    makers = [
        lambda ps: Int8AdamW(ps, min_numel=0, block_size=256, compiled=True),
        lambda ps: Int8Lion(ps, min_numel=0, block_size=256, compiled=True),
        lambda ps: Int8SGD(ps, min_numel=0, block_size=256, compiled=True),
    ]
    for make in makers:
        # 64 x 130: whole blocks and a tail block, two calls that write one parameter.
        compiled, plain = torch.nn.Parameter(torch.ones(64, 130)), torch.nn.Parameter(torch.ones(64, 130))
        opt_compiled, opt_plain = make([compiled]), make([plain])
        for _ in range(2):
            compiled.grad, plain.grad = torch.randn(64, 130), None
            plain.grad = compiled.grad.clone()
            opt_compiled.step()
            opt_plain.step()
        torch.testing.assert_close(compiled, plain)
    assert not kernels._FAILED and len(kernels._COMPILED) == 3
