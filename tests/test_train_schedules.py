"""The training loop tools: LR schedules and their schedulers, and weight-decay parameter groups."""

from __future__ import annotations

import pytest
import torch

from deploy_opt.train.param_groups import decay_groups
from deploy_opt.train.schedules import (
    ScheduleConfig,
    build_scheduler,
    schedule_factor,
    step_decay,
    warmup_cosine,
    warmup_linear,
)
from dopt_common.errors import ConfigError, InputError

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
