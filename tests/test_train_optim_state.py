"""The int8 optimizers' state: fp32 fallback rules, checkpoints that resume, mismatch errors and conversions."""

from __future__ import annotations

import copy

import pytest
import torch

from deploy_opt.train.optimizers import Int8AdamW, Int8Lion, Int8SGD
from dopt_common.errors import CheckpointError

torch.set_num_threads(1)


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
    assert kinds == {
        "embed.weight": "fp32",
        "body.weight": "int8",
        "body.bias": "fp32",
        "head.weight": "fp32",
        "head.bias": "fp32",
    }
    assert optimizer.state[model.body.weight]["exp_avg_sq_codes"].dtype == torch.uint8


def test_names_in_groups_and_globs_select_fp32() -> None:
    model = _Net()
    groups = [
        {"params": [model.embed.weight, model.body.weight], "names": ["embed.weight", "body.weight"]},
        {"params": [model.body.bias], "names": ["body.bias"], "weight_decay": 0.0},
    ]
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


@pytest.mark.parametrize(
    ("saved", "current", "message"),
    [
        (
            lambda n: Int8AdamW(n, state="fp32"),
            lambda n: Int8AdamW(n),
            "state: checkpoint fp32, optimizer int8; pass convert=True to convert",
        ),
        (
            lambda n: Int8AdamW(n, block_size=256),
            lambda n: Int8AdamW(n, block_size=512),
            "block_size: checkpoint 256, optimizer 512; pass convert=True",
        ),
        (
            lambda n: Int8AdamW(n, block_size=256),
            lambda n: Int8AdamW(n, block_size=256, fp32_patterns=("head",)),
            "fp32_patterns: checkpoint embed,lm_head, optimizer head",
        ),
        (lambda n: Int8Lion(n), lambda n: Int8AdamW(n), "optimizer: checkpoint Int8Lion, optimizer Int8AdamW"),
        (
            lambda n: torch.optim.AdamW([p for _, p in n]),
            lambda n: Int8AdamW(n),
            "state: checkpoint fp32, optimizer int8; pass convert=True",
        ),
        (
            lambda n: torch.optim.SGD([p for _, p in n], momentum=0.9),
            lambda n: Int8AdamW(n, state="fp32"),
            "optimizer: checkpoint Int8SGD, optimizer Int8AdamW",
        ),
    ],
    ids=["state", "block_size", "patterns", "type", "torch-adamw", "torch-sgd"],
)
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


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (
            lambda n: Int8AdamW(n, lr=1e-2, weight_decay=0.0, block_size=256),
            lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.0),
        ),
        (lambda n: Int8SGD(n, lr=1e-2, block_size=256), lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9)),
    ],
    ids=["adamw", "sgd"],
)
def test_to_fp32_state_dict_loads_into_torch_optimizers(ours: object, theirs: object) -> None:
    model = _Net()
    optimizer = ours(model.named_parameters())  # type: ignore[operator]
    _train(model, optimizer, 3)
    fp32 = optimizer.to_fp32_state_dict()
    assert fp32["quant_config"]["state"] == "fp32"
    body = fp32["state"][1]  # body.weight is the second parameter
    assert all(v.dtype == torch.float32 and v.shape == model.body.weight.shape for k, v in body.items() if k != "step")
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


@pytest.mark.parametrize("optimizer", [Int8AdamW, Int8Lion, Int8SGD])
def test_fp32_patterns_may_be_any_iterable_or_one_string(optimizer) -> None:
    params = [torch.nn.Parameter(torch.zeros(8))]
    assert optimizer(params, fp32_patterns=(p for p in ("embed", "head"))).config.fp32_patterns == ("embed", "head")
    assert optimizer(params, fp32_patterns="head").config.fp32_patterns == ("head",)
    assert optimizer(params).config.fp32_patterns == ("embed", "lm_head")
    with pytest.raises(TypeError, match="unexpected keyword argument 'fp32_pattern'"):
        optimizer(params, fp32_pattern="head")
