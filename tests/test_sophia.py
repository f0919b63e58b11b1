"""Sophia and Int8Sophia against an oracle written from the paper's algorithm 3; the two Hessian estimators
against exact diagonals; checkpoints; the training loop and the recommender."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from deploy_opt.train import Int8Sophia, Sophia
from deploy_opt.train.hessian import gauss_newton_bartlett, hutchinson, resolve_estimator
from deploy_opt.train.state_io import optimizer_state_bytes
from dopt_common.errors import CheckpointError, ConfigError


def _oracle(
    theta: list[torch.Tensor],
    grads: list[list[torch.Tensor]],
    estimates: dict[int, list[torch.Tensor]],
    lr: float,
    beta1: float,
    beta2: float,
    rho: float,
    wd: float,
    eps: float,
    k: int,
) -> list[torch.Tensor]:
    """Liu et al. 2023, algorithm 3, one tensor at a time in float64: m, h (EMA every k steps from t = 1), decay,
    clipped step."""
    theta = [t.double().clone() for t in theta]
    m = [torch.zeros_like(t) for t in theta]
    h = [torch.zeros_like(t) for t in theta]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            m[i] = beta1 * m[i] + (1 - beta1) * g.double()
            if t % k == 1 % k:  # t mod k = 1 (for k = 1: every step)
                h[i] = beta2 * h[i] + (1 - beta2) * estimates[t][i].double()
            theta[i] = theta[i] - lr * wd * theta[i]
            ratio = m[i] / torch.maximum(rho * h[i], torch.full_like(h[i], eps))
            theta[i] = theta[i] - lr * ratio.clamp(-1.0, 1.0)
    return theta


def _random_run(k: int, steps: int, seed: int = 0) -> tuple[list[list[torch.Tensor]], dict[int, list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(64, 96), (96,)]
    grads = [[torch.randn(s, generator=gen) * 0.1 for s in shapes] for _ in range(steps)]
    estimates = {t: [torch.rand(s, generator=gen) * 3 for s in shapes] for t in range(1, steps + 1)}
    return grads, estimates


def _drive(
    optimizer: Int8Sophia,
    params: list[torch.Tensor],
    grads: list[list[torch.Tensor]],
    estimates: dict[int, list[torch.Tensor]],
) -> list[int]:
    due_at = []
    for t, step_grads in enumerate(grads, start=1):
        if optimizer.hessian_due():
            due_at.append(t)
            optimizer.update_hessian(dict(zip(params, estimates[t], strict=True)))
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        optimizer.step()
    return due_at


@pytest.mark.parametrize("k", [1, 3, 10])
def test_sophia_matches_the_paper_oracle(k: int) -> None:
    grads, estimates = _random_run(k, steps=25)
    torch.manual_seed(1)
    params = [torch.randn(64, 96, requires_grad=True), torch.randn(96, requires_grad=True)]
    start = [p.detach().clone() for p in params]
    hyper = {"lr": 0.01, "betas": (0.9, 0.95), "rho": 0.05, "weight_decay": 0.1, "eps": 1e-12, "update_period": k}
    optimizer = Sophia(params, **hyper)
    due_at = _drive(optimizer, params, grads, estimates)
    assert due_at == [t for t in range(1, 26) if (t - 1) % k == 0]
    expected = _oracle(start, grads, estimates, 0.01, 0.9, 0.95, 0.05, 0.1, 1e-12, k)
    for p, e in zip(params, expected, strict=True):
        torch.testing.assert_close(p.detach().double(), e, rtol=1e-5, atol=1e-6)
    # Untouched by the step: the clip bounds each update to lr per element (plus the decay).
    assert all(p.grad is not None for p in params)


def test_int8_sophia_follows_fp32_and_halves_nothing_but_state() -> None:
    grads, estimates = _random_run(10, steps=30, seed=3)
    torch.manual_seed(2)
    base = [torch.randn(64, 96), torch.randn(96)]
    results = {}
    for cls in (Sophia, Int8Sophia):
        params = [b.clone().requires_grad_(True) for b in base]
        optimizer = cls(params, lr=0.01, rho=0.05, min_numel=1024, block_size=256)
        _drive(optimizer, params, grads, estimates)
        results[cls.__name__] = (params, optimizer_state_bytes(optimizer))
    (fp32, fp32_bytes), (int8, int8_bytes) = results["Sophia"], results["Int8Sophia"]
    moved = (fp32[0].detach() - base[0]).norm()
    assert (int8[0].detach() - fp32[0].detach()).norm() < 0.05 * moved
    # Two states per element: 8 bytes in fp32; 2 bytes + one fp32 scale per 256 in int8 (the bias stays fp32).
    assert fp32_bytes["by_kind"]["hessian"] == fp32_bytes["by_kind"]["exp_avg"] == 4 * (64 * 96 + 96)
    assert int8_bytes["by_kind"]["hessian"] == 64 * 96 + 4 * (64 * 96 // 256) + 4 * 96


def test_sophia_checkpoint_round_trip_and_checks() -> None:
    grads, estimates = _random_run(2, steps=6)
    params = [torch.randn(64, 96, requires_grad=True), torch.randn(96, requires_grad=True)]
    optimizer = Int8Sophia(params, lr=0.01, update_period=2, min_numel=1024)
    _drive(optimizer, params, grads[:3], estimates)
    saved = copy.deepcopy(optimizer.state_dict())
    twin_params = [p.detach().clone().requires_grad_(True) for p in params]
    twin = Int8Sophia(twin_params, lr=0.01, update_period=2, min_numel=1024)
    twin.load_state_dict(saved)
    assert twin.steps_done() == 3 and twin.hessian_due() is False
    rest = {t - 3: e for t, e in estimates.items() if t > 3}
    _drive(optimizer, params, grads[3:], rest)
    _drive(twin, twin_params, grads[3:], rest)
    for a, b in zip(params, twin_params, strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(CheckpointError, match="state: checkpoint int8, optimizer fp32"):
        Sophia([p.detach().clone().requires_grad_(True) for p in params], update_period=2).load_state_dict(saved)
    converted = Sophia([p.detach().clone().requires_grad_(True) for p in params], update_period=2)
    converted.load_state_dict(saved, convert=True)
    assert "hessian" in converted.state[converted.param_groups[0]["params"][0]]
    from deploy_opt.train import Int8AdamW

    with pytest.raises(CheckpointError, match="Int8Sophia"):
        Int8AdamW([p.detach().clone().requires_grad_(True) for p in params]).load_state_dict(saved)


def test_sophia_rejects_bad_hyper_parameters() -> None:
    params = [torch.zeros(3, requires_grad=True)]
    with pytest.raises(ConfigError, match="rho"):
        Sophia(params, rho=0.0)
    with pytest.raises(ConfigError, match="update_period"):
        Sophia(params, update_period=0)
    with pytest.raises(ConfigError, match="Int8Sophia"):
        Sophia(params, state="int8")


def test_gauss_newton_bartlett_is_the_fisher_diagonal_in_expectation() -> None:
    # A linear softmax model on one input: E[ĝ²] = diag(J^T (diag(p) - p p^T) J), the Gauss-Newton diagonal.
    torch.manual_seed(0)
    weight = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(3)
    probs = torch.softmax(weight.detach() @ x, dim=0)
    exact = (probs - probs**2)[:, None] * (x**2)[None, :]
    gen = torch.Generator().manual_seed(0)
    total = torch.zeros_like(weight)
    draws = 4000
    for _ in range(draws):
        logits = (weight @ x)[None]
        total += gauss_newton_bartlett(logits, [weight], gen)[weight]
    torch.testing.assert_close(total / draws, exact, rtol=0.1, atol=0.01)


def test_hutchinson_is_the_hessian_diagonal_in_expectation_and_leaves_the_gradient() -> None:
    torch.manual_seed(0)
    a = torch.randn(6, 6)
    hess = a @ a.T + torch.eye(6)
    theta = torch.randn(6, requires_grad=True)
    gen = torch.Generator().manual_seed(0)
    total = torch.zeros(6)
    draws = 3000
    for _ in range(draws):
        theta.grad = None
        loss = 0.5 * theta @ hess @ theta
        total += hutchinson(loss, [theta], gen)[theta]
    torch.testing.assert_close(total / draws, torch.diagonal(hess), rtol=0.15, atol=0.3)
    torch.testing.assert_close(theta.grad, hess @ theta.detach())


def test_estimator_choice() -> None:
    assert resolve_estimator("auto", True) == "gnb"
    assert resolve_estimator("auto", False) == "hutchinson"
    with pytest.raises(ConfigError, match="hutchinson"):
        resolve_estimator("gnb", False)
    with pytest.raises(ConfigError, match="logits"):
        gauss_newton_bartlett(torch.zeros(3), [torch.zeros(1, requires_grad=True)])


@pytest.mark.parametrize("estimator", ["gnb", "hutchinson"])
def test_train_run_with_sophia_learns_the_digits(tmp_path, estimator: str) -> None:
    from deploy_opt.config.profiles import config_path
    from deploy_opt.train.config import load_train_config
    from deploy_opt.train.loop import train

    config = load_train_config(
        config_path(None, "train_digits"),
        [
            "optimizer.type=sophia",
            "optimizer.lr=0.003",
            "optimizer.betas=[0.9,0.99]",
            "epochs=2",
            f"optimizer.estimator={estimator}",
            "optimizer.state=int8",
            "optimizer.min_numel=1024",
        ],
    )
    result = train(config, tmp_path / "run", progress=False)
    assert result.completed and result.metrics["eval_accuracy"] > 0.85
    assert 0 < result.optimizer_state_bytes


def test_the_recommender_offers_sophia_for_long_llm_pretraining() -> None:
    from deploy_opt.train.recommend import recommend

    long = recommend("llm", "125M", "10B", memory_gb=80, seq_len=4096)
    assert long.optimizer == "sophia" and "Liu et al. 2023" in long.reasons[0][1]
    assert recommend("llm", "125M", "10B", memory_gb=80, seq_len=512).optimizer == "adamw"
    assert recommend("llm", "125M", "10B", memory_gb=80).optimizer == "adamw"
    with pytest.raises(ConfigError, match="seq_len"):
        recommend("llm", "125M", "10B", memory_gb=80, seq_len=0)


@pytest.mark.slow
def test_sophia_fine_tunes_the_minilm_pair_slice_with_gnb_on_the_pair_logits(tmp_path) -> None:
    pytest.importorskip("tokenizers")
    from deploy_opt.config.profiles import config_path
    from deploy_opt.demo.minilm_pairs import pair_data, pair_logits
    from deploy_opt.train.config import load_train_config
    from deploy_opt.train.loop import train

    data = pair_data(batch_size=8, seed=0)
    batches = data.train(0)
    assert all(b[0][0].shape[0] == 8 for b in batches) and data.logits is pair_logits
    config = load_train_config(
        config_path("train_minilm", "train_minilm"),
        [
            "optimizer.type=sophia",
            "optimizer.lr=5e-5",
            "steps=3",
            "batch_size=8",
            "optimizer.update_period=2",
            "optimizer.state=int8",
        ],
    )
    result = train(config, tmp_path / "run", progress=False)
    assert result.completed and math.isfinite(result.metrics["eval_loss"])
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["optimizer"]["state"]
    assert any("hessian_codes" in s for s in state.values())  # estimates at steps 1 and 3, stored in int8
