"""The training tools: memory estimate, LR schedules, weight-decay groups and the recommender."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from deploy_opt.train.memory import GB, estimate_memory, format_estimate, parse_count
from deploy_opt.train.param_groups import decay_groups
from deploy_opt.train.recommend import format_recommendation, recommend
from deploy_opt.train.schedules import (
    ScheduleConfig,
    build_scheduler,
    schedule_factor,
    step_decay,
    warmup_cosine,
    warmup_linear,
)
from dopt_common.errors import ConfigError, InputError

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


# ---------------------------------------------------------------- schedules


def test_warmup_cosine_key_steps() -> None:
    total = 1000  # warmup = ceil(0.03 * 1000) = 30 steps
    assert warmup_cosine(0, total) == pytest.approx(1 / 30)
    assert warmup_cosine(14, total) == pytest.approx(0.5)
    assert warmup_cosine(29, total) == pytest.approx(1.0)
    assert warmup_cosine(30, total) == pytest.approx(1.0)
    assert warmup_cosine(515, total) == pytest.approx(0.55)  # halfway through the decay: (1 + 0.1) / 2
    assert warmup_cosine(1000, total) == pytest.approx(0.1)
    assert warmup_cosine(5000, total) == pytest.approx(0.1)
    values = [warmup_cosine(s, total) for s in range(30, 1001)]
    assert all(b <= a for a, b in zip(values, values[1:], strict=False)) and min(values) > 0


def test_warmup_linear_key_steps() -> None:
    total = 200  # warmup = 20 steps, decay over 180
    assert warmup_linear(0, total, warmup_ratio=0.1, min_lr_ratio=0.2) == pytest.approx(1 / 20)
    assert warmup_linear(19, total, warmup_ratio=0.1, min_lr_ratio=0.2) == pytest.approx(1.0)
    assert warmup_linear(110, total, warmup_ratio=0.1, min_lr_ratio=0.2) == pytest.approx(0.6)
    assert warmup_linear(200, total, warmup_ratio=0.1, min_lr_ratio=0.2) == pytest.approx(0.2)
    assert warmup_linear(999, total, warmup_ratio=0.1, min_lr_ratio=0.2) == pytest.approx(0.2)


def test_no_warmup_starts_at_peak() -> None:
    assert warmup_cosine(0, 100, warmup_ratio=0.0) == 1.0
    assert schedule_factor("constant", 50, 100) == 1.0


def test_step_decay_key_steps() -> None:
    assert step_decay(0, 100, step_size=30) == 1.0
    assert step_decay(29, 100, step_size=30) == 1.0
    assert step_decay(30, 100, step_size=30) == 0.5
    assert step_decay(60, 100, step_size=30) == 0.25
    assert step_decay(500, 100, step_size=30) == 0.1  # floored at min_lr_ratio
    assert step_decay(49, 100, milestones=[50, 80], gamma=0.7) == 1.0
    assert step_decay(50, 100, milestones=[50, 80], gamma=0.7) == pytest.approx(0.7)
    assert step_decay(80, 100, milestones=[50, 80], gamma=0.7) == pytest.approx(0.49)
    assert step_decay(0, 100, step_size=30, warmup_ratio=0.1) == pytest.approx(0.1)  # warmup: 10 steps


def test_step_decay_refuses_a_drop_past_the_cap() -> None:
    with pytest.raises(ConfigError, match=r"gamma 0.1 drops the LR by 90%.*max_drop 50%.*gamma >= 0.5"):
        step_decay(0, 100, step_size=10, gamma=0.1)
    assert step_decay(10, 100, step_size=10, gamma=0.1, max_drop=0.9, min_lr_ratio=0.01) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"type": "exponential"}, "scheduler type 'exponential'"),
        ({"warmup_ratio": 1.0}, "warmup_ratio"),
        ({"min_lr_ratio": 0.0}, "min_lr_ratio"),
        ({"type": "step"}, "exactly one of step_size"),
        ({"type": "step", "step_size": 10, "milestones": (5,)}, "exactly one of step_size"),
        ({"type": "step", "milestones": (50, 50)}, "strictly increasing"),
        ({"type": "step", "step_size": 0}, "step_size"),
        ({"gamma": 1.5}, "gamma"),
    ],
)
def test_schedule_config_rejects_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ScheduleConfig(**kwargs)


def test_schedule_config_from_mapping() -> None:
    config = ScheduleConfig.from_mapping({"type": "cosine", "warmup_ratio": 0.1, "min_lr_ratio": 0.05})
    assert config.type == "warmup_cosine" and config.to_json()["warmup_ratio"] == 0.1
    with pytest.raises(ConfigError, match="unknown key.*warmup_steps"):
        ScheduleConfig.from_mapping({"type": "cosine", "warmup_steps": 10})


@pytest.mark.parametrize("kind", ["warmup_cosine", "warmup_linear", "step", "constant"])
def test_build_scheduler_follows_schedule_factor(kind: str) -> None:
    extra = {"step_size": 7} if kind == "step" else {}
    param = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([param], lr=0.2)
    sched = build_scheduler(opt, kind, 40, warmup_ratio=0.1, **extra)
    for step in range(45):
        assert opt.param_groups[0]["lr"] == pytest.approx(
            0.2 * schedule_factor(kind, step, 40, warmup_ratio=0.1, **extra)
        )
        opt.step()
        sched.step()


def test_resumed_scheduler_continues_at_the_same_lr() -> None:
    def make() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(4))], lr=1e-3)
        return opt, build_scheduler(opt, ScheduleConfig("warmup_cosine", warmup_ratio=0.1), 100)

    opt, sched = make()
    lrs = []
    for _ in range(60):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # Save after step 30 of a second run, restore into fresh objects, continue.
    opt2, sched2 = make()
    for _ in range(30):
        opt2.step()
        sched2.step()
    saved = {"opt": opt2.state_dict(), "sched": sched2.state_dict()}
    assert saved["sched"]["last_epoch"] == 30
    opt3, sched3 = make()
    opt3.load_state_dict(saved["opt"])
    sched3.load_state_dict(saved["sched"])
    resumed = []
    for _ in range(30):
        resumed.append(opt3.param_groups[0]["lr"])
        opt3.step()
        sched3.step()
    assert resumed == pytest.approx(lrs[30:])


# ---------------------------------------------------------------- parameter groups


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.conv = torch.nn.Conv1d(8, 8, 3)
        self.bn = torch.nn.BatchNorm1d(8)
        self.proj = torch.nn.Linear(8, 8)
        self.layer_norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.scale = torch.nn.Parameter(torch.ones(()))


def test_decay_groups_default_rules() -> None:
    model = _Tiny()
    groups = decay_groups(model, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert groups[0]["names"] == ["embed.weight", "conv.weight", "proj.weight"]
    assert groups[1]["names"] == [
        "scale",
        "conv.bias",
        "bn.weight",
        "bn.bias",
        "proj.bias",
        "layer_norm.weight",
        "layer_norm.bias",
    ]  # a module's own parameters come first in named_parameters()
    trainable = [p for p in model.parameters() if p.requires_grad]
    listed = [p for g in groups for p in g["params"]]
    assert len(listed) == len(trainable) and {id(p) for p in listed} == {id(p) for p in trainable}
    for g in groups:
        assert len(g["params"]) == len(g["names"])


def test_decay_groups_extra_patterns_and_globs() -> None:
    groups = decay_groups(_Tiny().named_parameters(), 0.01, extra_no_decay=("EMBED", "conv.*"))
    assert groups[0]["names"] == ["proj.weight"]
    assert "embed.weight" in groups[1]["names"] and "conv.weight" in groups[1]["names"]


def test_decay_groups_drop_empty_groups_and_work_with_torch_adamw() -> None:
    biases = [("a.bias", torch.nn.Parameter(torch.zeros(3))), ("b.bias", torch.nn.Parameter(torch.zeros(2)))]
    groups = decay_groups(biases, 0.1)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.0
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(decay_groups(model, 0.05), lr=1e-3)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]


def test_decay_groups_plain_tensors_and_errors() -> None:
    params = [torch.nn.Parameter(torch.zeros(3, 3)), torch.nn.Parameter(torch.zeros(3))]
    assert [g["names"] for g in decay_groups(params, 0.1)] == [["0"], ["1"]]
    with pytest.raises(ConfigError, match="weight_decay -1"):
        decay_groups(params, -1)
    with pytest.raises(InputError, match="not a tensor"):
        decay_groups([("w", 3)], 0.1)
    with pytest.raises(InputError, match="no trainable"):
        decay_groups(_Tiny().frozen, 0.1)


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


def test_llm_with_ample_memory_gets_adamw_and_says_sophia_is_not_built() -> None:
    rec = recommend("llm", 7e9, 10_000_000, 141)
    assert rec.optimizer == "adamw" and rec.state == "int8"  # >= 1B → int8 regardless of memory
    assert "Sophia" in _choice(rec, "optimizer")[1] and "not built yet" in _choice(rec, "optimizer")[1]


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
