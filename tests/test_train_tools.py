"""The training sizing tools: the memory estimate and the optimizer recommender built on it."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from deploy_opt.train.memory import GB, estimate_memory, format_estimate, parse_count
from deploy_opt.train.recommend import format_recommendation, recommend
from dopt_common.errors import ConfigError

# ---------------------------------------------------------------- memory


def test_7b_adamw_fp32_state_is_16_bytes_per_param() -> None:
    est = estimate_memory(7e9, "adamw", "fp32", "bf16")
    assert est.bytes_per_param == 16
    assert est.total_bytes == 112 * 10**9
    assert est.per_device_bytes == est.total_bytes
    assert [c.bytes_per_param for c in est.components] == [4, 2, 2, 4, 4]


def test_7b_adamw_int8_state_is_about_70_gb() -> None:
    est = estimate_memory("7B", "adamw", "int8", "bf16")
    scales = 2 * 4 * math.ceil(7e9 / 2048)  # two states, one fp32 scale per 2048-element block each
    assert est.total_bytes == (2 + 2 + 4 + 1 + 1) * 7 * 10**9 + scales
    assert est.total_bytes / GB == pytest.approx(70.0, abs=0.1)
    assert est.bytes_per_param == pytest.approx(10.0, abs=0.01)
    assert est.state_bytes == 2 * 7 * 10**9 + scales


def test_shards_divide_optimizer_state_and_master_weights_only() -> None:
    est = estimate_memory(7e9, "adamw", "int8", "bf16", shards=8)
    assert set(est.sharded_components) == {
        "master weights (fp32)",
        "state: exp_avg (int8)",
        "state: exp_avg_sq (int8)",
        "scales (fp32, 1 per 2048 per state)",
    }
    assert est.component("compute weights (bf16)").per_device_bytes == 14 * 10**9
    assert est.component("master weights (fp32)").per_device_bytes == 28 * 10**9 // 8
    assert est.total_bytes == estimate_memory(7e9, "adamw", "int8", "bf16").total_bytes
    full = estimate_memory(7e9, "adamw", "int8", "bf16", shards=8, shard="full")
    assert full.per_device_bytes == pytest.approx(full.total_bytes / 8, rel=1e-6)


@pytest.mark.parametrize(
    ("optimizer", "state", "dtype", "per_param"),
    [
        ("lion", "fp32", "bf16", 12),
        ("sgd", "fp32", "fp32", 12),
        ("sgd", "int8", "fp16", 9),
        ("adamw", "fp32", "fp32", 16),
    ],
)
def test_bytes_per_param_by_optimizer(optimizer: str, state: str, dtype: str, per_param: int) -> None:
    est = estimate_memory(1 << 30, optimizer, state, dtype)
    assert est.bytes_per_param == pytest.approx(per_param, abs=0.01)


def test_format_and_json() -> None:
    est = estimate_memory(7e9, "adamw", "int8", "bf16", shards=8)
    text = format_estimate(est)
    for word in ("master weights", "compute weights", "gradients", "exp_avg_sq", "scales", "total", "70.03", "ZeRO-1"):
        assert word in text
    data = json.loads(json.dumps(est.to_json()))
    assert data["total_bytes"] == est.total_bytes and len(data["components"]) == 6


def test_fp32_params_have_no_master_copy() -> None:
    est = estimate_memory(1000, "adamw", "fp32", "fp32")
    assert not est.master_weights and not any("master" in c.name for c in est.components)
    assert not estimate_memory(1000, "adamw", "fp32", "bf16", master_weights=False).master_weights


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"optimizer": "adam"}, "optimizer 'adam'"),
        ({"state": "int4"}, "state 'int4'"),
        ({"param_dtype": "fp8"}, "param dtype 'fp8'"),
        ({"shards": 0}, "shards"),
        ({"block_size": 32}, "block size"),
        ({"shard": "grads"}, "shard 'grads'"),
        ({"param_dtype": "fp32", "master_weights": True}, "own master copy"),
    ],
)
def test_estimate_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        estimate_memory(1000, **kwargs)


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("7e9", 7 * 10**9),
        ("7B", 7 * 10**9),
        ("125M", 125 * 10**6),
        ("7000000000", 7 * 10**9),
        ("1.5k", 1500),
        (" 2b ", 2 * 10**9),
        ("100_000", 100_000),
        (7e9, 7 * 10**9),
        (42, 42),
    ],
)
def test_parse_count(text: str | int | float, count: int) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["", "seven", "7X", "1.5", "0", "-3", "nan", "inf", "1e400", True, None, "7BB"])
def test_parse_count_rejects_garbage(text: object) -> None:
    with pytest.raises(ConfigError, match="count"):
        parse_count(text)  # type: ignore[arg-type]


def test_estimate_matches_torch_adamw_state() -> None:
    # Independent reference: the fp32 moments torch.optim.AdamW really allocates.
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    measured = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
    count = sum(p.numel() for p in model.parameters())
    assert estimate_memory(count, "adamw", "fp32", "fp32").state_bytes == measured


def test_estimate_matches_int8_optimizer_state_bytes() -> None:
    optimizers = pytest.importorskip("deploy_opt.train.optimizers", reason="T1's int8 optimizers not there yet")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False), torch.nn.Linear(256, 256, bias=False))
    opt = optimizers.Int8AdamW(model.named_parameters(), block_size=2048)
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    measured = optimizers.optimizer_state_bytes(opt)["total"]
    count = sum(p.numel() for p in model.parameters())
    estimated = estimate_memory(count, "adamw", "int8", "fp32").state_bytes
    # Each 65,536-element tensor is exactly 32 blocks, so only bookkeeping (step counters, a code table) differs.
    assert measured == pytest.approx(estimated, rel=0.02)


# ---------------------------------------------------------------- recommender


def _choice(rec, prefix: str) -> tuple[str, str]:
    return next((c, r) for c, r in rec.reasons if c.startswith(prefix))


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_small_data_cnn_or_mlp_gets_sgd(kind: str) -> None:
    rec = recommend(kind, 1_000_000, 50_000, 16)
    assert rec.optimizer == "sgd" and rec.lr_range == (0.05, 0.1) and rec.state == "fp32"
    assert "< 100,000" in _choice(rec, "optimizer")[1]


def test_large_data_cnn_gets_adamw() -> None:
    rec = recommend("cnn", 25_000_000, 1_281_167, 16)
    assert rec.optimizer == "adamw" and rec.lr_range == (3e-4, 1e-3)


def test_tight_transformer_gets_lion_at_a_fraction_of_the_adamw_lr() -> None:
    rec = recommend("transformer", 350_000_000, 1_000_000, 6)  # fp32-state AdamW: 5.6 GB > 80% of 6 GB
    assert rec.optimizer == "lion"
    assert rec.lr_range == pytest.approx((1e-4 / 5, 5e-4 / 3))
    assert rec.schedule.type == "warmup_cosine" and rec.schedule.warmup_ratio > 0
    assert rec.state == "int8"  # 100M-1B and tight
    assert "tight" in _choice(rec, "optimizer")[1]


def test_transformer_with_ample_memory_gets_adamw_fp32() -> None:
    rec = recommend("transformer", 350_000_000, 1_000_000, 80)
    assert rec.optimizer == "adamw" and rec.state == "fp32" and rec.lr_range == (1e-4, 5e-4)
    assert "ample" in _choice(rec, "state")[1]


def test_llm_with_ample_memory_gets_adamw_and_says_when_sophia_applies() -> None:
    rec = recommend("llm", 7e9, 10_000_000, 141)
    assert rec.optimizer == "adamw" and rec.state == "int8"  # >= 1B → int8 regardless of memory
    assert "Sophia is offered for pre-training on sequences of 2,048+ tokens" in _choice(rec, "optimizer")[1]
    long = recommend("llm", 7e9, 10_000_000, 141, seq_len=8192)
    assert long.optimizer == "sophia" and long.state == "int8"


def test_tight_llm_still_gets_adamw_and_warns_when_nothing_fits() -> None:
    rec = recommend("llm", "7B", 10_000_000, 24)
    assert rec.optimizer == "adamw" and rec.state == "int8"
    assert rec.chosen_gb == pytest.approx(70.03, abs=0.01)
    assert any(c.startswith("warning") for c, _ in rec.reasons)


def test_small_model_gets_fp32_state_even_when_tight() -> None:
    rec = recommend("transformer", 60_000_000, 1_000_000, 1)
    assert rec.optimizer == "lion" and rec.state == "fp32"
    assert "overhead" in _choice(rec, "state")[1]


def test_recommendation_is_printed_logged_and_serialised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="deploy_opt.train.recommend"):
        rec = recommend("mlp", "2M", "60k", 8)
    text = format_recommendation(rec)
    assert len(text.splitlines()) == 1 + len(rec.reasons)
    assert all(reason in text for _, reason in rec.reasons)
    assert sum("recommend" in r.getMessage() for r in caplog.records) == len(rec.reasons)
    data = json.loads(json.dumps(rec.to_json()))
    assert data["optimizer"] == "sgd" and data["schedule"]["type"] == "warmup_cosine"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("rnn", 1000, 1000, 8), "model type 'rnn'"),
        (("cnn", "lots", 1000, 8), "count 'lots'"),
        (("cnn", 1000, 1000, 0), "memory_gb 0"),
        (("cnn", 1000, 1000, float("nan")), "memory_gb"),
    ],
)
def test_recommend_rejects_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        recommend(*args)
