"""The int8 block-wise optimizer core: codes, fallback rules, convergence against torch, checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch

from deploy_opt.train import blockwise
from deploy_opt.train.optimizers import Int8AdamW, Int8Lion, Int8SGD, optimizer_state_bytes
from dopt_common.errors import CheckpointError, ConfigError

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
    x = torch.cat([
        torch.zeros(64),  # an all-zero block
        torch.full((64,), 1e-30),  # an all-tiny block
        torch.full((64,), 1e30) * sign,  # huge
        torch.tensor([0.0, 1e-30, 1.0, 3e38] * 16),  # mixed, up to fp32's top
        torch.zeros(10),  # a short zero tail block
    ])
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


# --- fallback rules ------------------------------------------------------------------------------------------
class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 64)  # 6400 elements, fp32 by name
        self.body = torch.nn.Linear(64, 96)  # 6144 elements: int8; bias 96: fp32 (small)
        self.head = torch.nn.Linear(96, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.embed(tokens).mean(dim=1))))


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int = 0) -> float:
    gen = torch.Generator().manual_seed(seed)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        tokens = torch.randint(0, 100, (16, 5), generator=gen)
        optimizer.zero_grad()
        loss = model(tokens).square().mean()
        loss.backward()
        optimizer.step()
    return loss.item()


def _kinds(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, str]:
    return {name: "int8" if "exp_avg_codes" in optimizer.state[p] else "fp32" for name, p in model.named_parameters()}


def test_fp32_fallback_for_small_tensors_and_name_patterns() -> None:
    model = _Net()
    optimizer = Int8AdamW(model.named_parameters(), block_size=256)
    _train(model, optimizer, 2)
    kinds = _kinds(optimizer, model)
    assert kinds == {"embed.weight": "fp32", "body.weight": "int8", "body.bias": "fp32",
                     "head.weight": "fp32", "head.bias": "fp32"}
    assert optimizer.state[model.body.weight]["exp_avg_sq_codes"].dtype == torch.uint8


def test_names_in_groups_and_globs_select_fp32() -> None:
    model = _Net()
    groups = [{"params": [model.embed.weight, model.body.weight], "names": ["embed.weight", "body.weight"]},
              {"params": [model.body.bias], "names": ["body.bias"], "weight_decay": 0.0}]
    optimizer = Int8AdamW(groups, fp32_patterns=("body.*",), min_numel=0, block_size=64)
    assert optimizer.param_groups[0]["param_names"] == ["embed.weight", "body.weight"]
    _train(model, optimizer, 1)
    assert "exp_avg_codes" in optimizer.state[model.embed.weight]
    assert "exp_avg" in optimizer.state[model.body.weight]


def test_unnamed_params_fall_back_by_size_only() -> None:
    model = _Net()
    optimizer = Int8AdamW(model.parameters(), block_size=256)
    _train(model, optimizer, 1)
    assert "exp_avg_codes" in optimizer.state[model.embed.weight]


def test_state_fp32_keeps_everything_fp32_and_matches_torch_adamw() -> None:
    model = _Net()
    twin = copy.deepcopy(model)
    optimizer = Int8AdamW(model.named_parameters(), lr=1e-2, state="fp32")
    reference = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.01)
    _train(model, optimizer, 5)
    _train(twin, reference, 5)
    assert set(_kinds(optimizer, model).values()) == {"fp32"}
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_warmup_steps_switch_to_int8() -> None:
    model = _Net()
    optimizer = Int8AdamW(model.named_parameters(), block_size=256, fp32_warmup_steps=3)
    _train(model, optimizer, 2)
    assert _kinds(optimizer, model)["body.weight"] == "fp32"
    _train(model, optimizer, 1)
    assert _kinds(optimizer, model)["body.weight"] == "int8"
    assert "exp_avg" not in optimizer.state[model.body.weight]


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


@pytest.mark.parametrize(("int8", "fp32", "reference"), [
    (lambda n: Int8AdamW(n, lr=3e-3, **SMALL), lambda n: Int8AdamW(n, lr=3e-3, state="fp32"),
     lambda n: torch.optim.AdamW([p for _, p in n], lr=3e-3, weight_decay=0.01, foreach=True)),
    (lambda n: Int8SGD(n, lr=0.05, **SMALL), lambda n: Int8SGD(n, lr=0.05, state="fp32"),
     lambda n: torch.optim.SGD([p for _, p in n], lr=0.05, momentum=0.9)),
    (lambda n: Int8Lion(n, lr=2e-3, **SMALL), lambda n: Int8Lion(n, lr=2e-3, state="fp32"), None),
], ids=["adamw", "sgd", "lion"])
def test_optimizers_converge_like_their_fp32_twins(int8: object, fp32: object, reference: object) -> None:
    start = _fit(lambda n: Int8SGD(n, lr=0.0), steps=1)
    loss_int8, loss_fp32 = _fit(int8), _fit(fp32)
    assert loss_int8 < 0.5 * start
    assert abs(loss_int8 - loss_fp32) < 0.03
    if reference is not None:
        assert abs(_fit(reference) - loss_fp32) < 1e-4


# --- memory --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [256, 2048])
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


# --- checkpoints ---------------------------------------------------------------------------------------------
def _reloaded(state_dict: dict, tmp_path: object) -> dict:
    path = tmp_path / "optim.pt"  # type: ignore[operator]
    torch.save(state_dict, path)
    return torch.load(path, weights_only=True)


def test_int8_checkpoint_resumes_the_same_trajectory(tmp_path: object) -> None:
    model = _Net()
    optimizer = Int8AdamW(model.named_parameters(), block_size=256)
    _train(model, optimizer, 3)
    saved_model, saved_optim = copy.deepcopy(model.state_dict()), _reloaded(optimizer.state_dict(), tmp_path)
    assert saved_optim["quant_config"]["block_size"] == 256
    _train(model, optimizer, 4, seed=1)

    resumed = _Net()
    resumed.load_state_dict(saved_model)
    optimizer2 = Int8AdamW(resumed.named_parameters(), block_size=256)
    optimizer2.load_state_dict(saved_optim)
    _train(resumed, optimizer2, 4, seed=1)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def _checkpoint(make: object, steps: int = 2) -> tuple[_Net, dict]:
    model = _Net()
    optimizer = make(model.named_parameters())  # type: ignore[operator]
    _train(model, optimizer, steps)
    return model, optimizer.state_dict()


@pytest.mark.parametrize(("saved", "current", "message"), [
    (lambda n: Int8AdamW(n, state="fp32"), lambda n: Int8AdamW(n),
     "state: checkpoint fp32, optimizer int8; pass convert=True to convert"),
    (lambda n: Int8AdamW(n, block_size=256), lambda n: Int8AdamW(n, block_size=512),
     "block_size: checkpoint 256, optimizer 512; pass convert=True"),
    (lambda n: Int8AdamW(n, block_size=256), lambda n: Int8AdamW(n, block_size=256, fp32_patterns=("head",)),
     "fp32_patterns: checkpoint embed,lm_head, optimizer head"),
    (lambda n: Int8Lion(n), lambda n: Int8AdamW(n), "optimizer: checkpoint Int8Lion, optimizer Int8AdamW"),
    (lambda n: torch.optim.AdamW([p for _, p in n]), lambda n: Int8AdamW(n),
     "state: checkpoint fp32, optimizer int8; pass convert=True"),
    (lambda n: torch.optim.SGD([p for _, p in n], momentum=0.9), lambda n: Int8AdamW(n, state="fp32"),
     "optimizer: checkpoint Int8SGD, optimizer Int8AdamW"),
], ids=["state", "block_size", "patterns", "type", "torch-adamw", "torch-sgd"])
def test_config_mismatch_is_an_error_naming_the_difference(saved: object, current: object, message: str) -> None:
    model, state_dict = _checkpoint(saved)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(")):
        current(model.named_parameters()).load_state_dict(state_dict)  # type: ignore[operator]


def _moments(optimizer: Int8AdamW) -> dict[str, torch.Tensor]:
    state = optimizer.to_fp32_state_dict()["state"]
    return {f"{i}.{k}": v for i, s in state.items() for k, v in s.items() if k != "step"}



@pytest.mark.parametrize(
    "block_sizes", [(None, 256), (256, None), (256, 64)], ids=["fp32>int8", "int8>fp32", "reblock"]
)
def test_convert_between_fp32_int8_and_block_sizes(block_sizes: tuple[int | None, int | None]) -> None:
    def make(block_size: int | None) -> object:
        return lambda n: Int8AdamW(n, state="fp32") if block_size is None else Int8AdamW(n, block_size=block_size)

    model, state_dict = _checkpoint(make(block_sizes[0]))
    source = make(block_sizes[0])(model.named_parameters())
    source.load_state_dict(state_dict)
    target = make(block_sizes[1])(model.named_parameters())
    target.load_state_dict(state_dict, convert=True)
    assert target.state_dict()["quant_config"] == target.config.to_dict()
    expect = "int8" if block_sizes[1] else "fp32"
    assert _kinds(target, model)["body.weight"] == expect
    if block_sizes[1]:
        assert target.state[model.body.weight]["exp_avg_scales"].numel() == 6144 // block_sizes[1]
    before, after = _moments(source), _moments(target)
    for key in before:  # one extra round of 8-bit rounding at most
        torch.testing.assert_close(after[key], before[key], rtol=0.05, atol=before[key].abs().max() / 100)
    _train(model, target, 2)  # and it keeps training


def test_torch_adamw_checkpoint_loads_into_fp32_state_and_converts_to_int8() -> None:
    model, state_dict = _checkpoint(lambda n: torch.optim.AdamW([p for _, p in n], lr=1e-2))
    twin = copy.deepcopy(model)
    reference = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    reference.load_state_dict(state_dict)
    same = Int8AdamW(model.named_parameters(), lr=1e-2, state="fp32")
    same.load_state_dict(state_dict)
    _train(model, same, 3, seed=2)
    _train(twin, reference, 3, seed=2)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    converted = Int8AdamW(model.named_parameters(), lr=1e-2, block_size=256)
    converted.load_state_dict(state_dict, convert=True)
    assert _kinds(converted, model)["body.weight"] == "int8"


@pytest.mark.parametrize(("ours", "theirs"), [
    (lambda n: Int8AdamW(n, lr=1e-2, weight_decay=0.0, block_size=256),
     lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.0)),
    (lambda n: Int8SGD(n, lr=1e-2, block_size=256), lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9)),
], ids=["adamw", "sgd"])
def test_to_fp32_state_dict_loads_into_torch_optimizers(ours: object, theirs: object) -> None:
    model = _Net()
    optimizer = ours(model.named_parameters())  # type: ignore[operator]
    _train(model, optimizer, 3)
    fp32 = optimizer.to_fp32_state_dict()
    assert fp32["quant_config"]["state"] == "fp32"
    body = fp32["state"][1]  # body.weight is the second parameter
    assert all(v.dtype == torch.float32 and v.shape == model.body.weight.shape
               for k, v in body.items() if k != "step")
    twin = copy.deepcopy(model)
    reference = theirs(list(twin.parameters()))  # type: ignore[operator]
    reference.load_state_dict(fp32)
    _train(model, optimizer, 2, seed=3)
    _train(twin, reference, 2, seed=3)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0.02, atol=2e-3)
    # and back into the same class with state="fp32", without conversion
    ours_fp32 = type(optimizer)(model.named_parameters(), state="fp32", block_size=256)
    ours_fp32.load_state_dict(fp32)


def test_bf16_params_keep_fp32_scales_after_loading() -> None:
    weight = torch.nn.Parameter(torch.randn(64, 128, dtype=torch.bfloat16))
    optimizer = Int8AdamW([weight], min_numel=0, block_size=256)
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    state_dict = optimizer.state_dict()
    fresh = Int8AdamW([weight], min_numel=0, block_size=256)
    fresh.load_state_dict(state_dict)
    assert fresh.state[weight]["exp_avg_scales"].dtype == torch.float32
    assert fresh.state[weight]["exp_avg_codes"].dtype == torch.int8
    fresh.step()
    assert torch.isfinite(weight.float()).all()


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"state": "int4"}, "state"), ({"lr": -1.0}, "lr"), ({"betas": (1.0, 0.9)}, "betas"),
    ({"min_numel": -1}, "min_numel"), ({"fp32_warmup_steps": 1.5}, "fp32_warmup_steps"),
    ({"second_moment_code": "log"}, "second_moment_code"),
])
def test_bad_arguments_are_config_errors(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Int8AdamW([torch.zeros(4, requires_grad=True)], **kwargs)


@pytest.mark.parametrize("make", [
    lambda ps: Int8AdamW(ps, min_numel=0, block_size=256),
    lambda ps: Int8AdamW(ps, min_numel=0, block_size=256, second_moment_code="dynamic"),
    lambda ps: Int8AdamW(ps, min_numel=0, block_size=256, second_moment_code="linear"),
    lambda ps: Int8Lion(ps, min_numel=0, block_size=256, weight_decay=0.1),
    lambda ps: Int8SGD(ps, min_numel=0, block_size=256, weight_decay=0.1),
    lambda ps: Int8SGD(ps, min_numel=0, block_size=256, nesterov=True),
], ids=["adamw", "adamw-dynamic", "adamw-linear", "lion", "sgd", "sgd-nesterov"])
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
    monkeypatch.setattr(kernels.torch, "compile", lambda fn, **kw: compile_(fn, backend="eager", **kw))
    monkeypatch.setattr(kernels, "_COMPILED", {})
    monkeypatch.setattr(kernels, "_FAILED", set())
    makers = [lambda ps: Int8AdamW(ps, min_numel=0, block_size=256, compiled=True),
              lambda ps: Int8Lion(ps, min_numel=0, block_size=256, compiled=True),
              lambda ps: Int8SGD(ps, min_numel=0, block_size=256, compiled=True)]
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
