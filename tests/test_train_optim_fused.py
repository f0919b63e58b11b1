"""The int8 optimizers' CUDA path, run on the CPU: one kernel call per parameter (tail included) with 0-d CPU
hyper-parameters, compiled with dynamic=False; and the fp32 state's multi-tensor (foreach) update."""

from __future__ import annotations

import pytest
import torch

from deploy_opt.train import kernels
from deploy_opt.train.blockwise import block_count, block_parts, scale_parts
from deploy_opt.train.optimizers import Int8AdamW, Int8Lion, Int8SGD, optimizer_state_bytes
from deploy_opt.train.sophia import Int8Sophia

torch.set_num_threads(1)

MAKERS = {
    "adamw": lambda ps, **kw: Int8AdamW(ps, block_size=256, **kw),
    "adamw-sqrt": lambda ps, **kw: Int8AdamW(ps, block_size=256, second_moment_code="sqrt", **kw),
    "adamw-linear": lambda ps, **kw: Int8AdamW(ps, block_size=256, second_moment_code="linear", **kw),
    "lion": lambda ps, **kw: Int8Lion(ps, block_size=256, weight_decay=0.1, **kw),
    "sgd": lambda ps, **kw: Int8SGD(ps, block_size=256, weight_decay=0.1, **kw),
    "sgd-nesterov": lambda ps, **kw: Int8SGD(ps, block_size=256, nesterov=True, **kw),
}
# A tail that is not a multiple of the block (64 x 130 = 32 blocks of 256 and 128), a tensor shorter than one
# block, one of whole blocks only, and one under the old 65,536-element threshold with a tail.
SHAPES = [(64, 130), (37,), (8, 256), (3001,)]


def _grads(shape: tuple[int, ...], steps: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ramp = torch.logspace(-4, 0, shape[-1])  # magnitudes over decades: blocks get different scales
    return [torch.randn(shape, generator=gen) * ramp for _ in range(steps)]


def _twins(name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> tuple:
    start = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    fused, plain = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opt_fused, opt_plain = MAKERS[name]([fused], min_numel=0), MAKERS[name]([plain], min_numel=0)
    opt_fused.use_kernels, opt_fused.per_param_kernels = True, True  # the CUDA path, uncompiled, on the CPU
    opt_plain.use_kernels = False  # the per-op eager reference
    return fused, plain, opt_fused, opt_plain


def _assert_same_state(ours: dict, reference: dict) -> None:
    for key, value in reference.items():
        other = ours[key]
        if value.dtype in (torch.int8, torch.uint8):  # a value on a rounding boundary may round the other way
            assert (value.int() - other.int()).abs().le(1).all()
            assert (value != other).sum() <= max(1, value.numel() // 1000)
        else:
            torch.testing.assert_close(other, value, rtol=1e-4, atol=1e-30)


def _assert_close_params(ours: torch.Tensor, reference: torch.Tensor, lion_lr: float | None) -> None:
    if lion_lr is None:
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
        return
    # Lion moves each element by lr * sign(...): where the interpolated momentum is ~0, a rounding flips the sign.
    off = ~torch.isclose(ours, reference, rtol=1e-5, atol=1e-6)
    assert off.sum() <= max(1, ours.numel() // 1000)
    assert ((ours - reference).abs()[off] <= 2 * lion_lr * 1.001).all()


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(MAKERS))
def test_per_param_kernel_matches_the_eager_reference(name: str, shape: tuple[int, ...]) -> None:
    fused, plain, opt_fused, opt_plain = _twins(name, shape)
    blocks = torch.nn.Parameter(plain.detach().clone())
    opt_blocks = MAKERS[name]([blocks], min_numel=0)
    opt_blocks.use_kernels = True  # the CPU path's block kernels (two calls where there is a tail)
    calls = []
    run_kernel = kernels.run_kernel

    def record(kernel: object, compile_: bool, param: torch.Tensor, *rest: object) -> None:
        calls.append((kernel, tuple(param.shape)))
        run_kernel(kernel, compile_, param, *rest)

    for grad in _grads(shape, 5):
        fused.grad, plain.grad, blocks.grad = grad.clone(), grad.clone(), grad.clone()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kernels, "run_kernel", record)
            opt_fused.step()
        opt_plain.step()
        opt_blocks.step()
    _assert_close_params(fused, plain, 1e-4 if name == "lion" else None)
    _assert_same_state(opt_fused.state[fused], opt_plain.state[plain])
    assert torch.equal(fused, blocks)  # the same arithmetic as the block kernels, bit for bit
    for key, value in opt_blocks.state[blocks].items():
        assert torch.equal(opt_fused.state[fused][key], value)
    numel = fused.numel()
    assert len(calls) == 5 and {shape for _, shape in calls} == {(numel,)}  # one call per step, tail included
    assert {k for k, _ in calls} <= {kernels.adamw_param, kernels.lion_param, kernels.sgd_param}
    assert opt_fused.step_paths == {"fused": 1} and opt_plain.step_paths == {"per-op": 1}


def test_bf16_params_take_the_per_param_kernel_like_the_reference() -> None:
    fused, plain, opt_fused, opt_plain = _twins("adamw", (64, 130), torch.bfloat16)
    for grad in _grads((64, 130), 3):
        fused.grad, plain.grad = grad.to(torch.bfloat16), grad.to(torch.bfloat16)
        opt_fused.step()
        opt_plain.step()
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused, plain, rtol=1e-2, atol=1e-3)  # bf16: one rounding of the parameter


@pytest.mark.parametrize("code", ["dynamic", "sqrt", "linear"])
def test_per_param_kernel_equals_the_block_kernels_bit_for_bit(code: str) -> None:
    # The tail block: zero gradient and zero codes, the smallest scale a block can get.
    numel, size = 3 * 256 + 40, 256
    gen = torch.Generator().manual_seed(2)
    param, grad = torch.randn(numel, generator=gen), torch.randn(numel, generator=gen)
    grad[-40:] = 0.0
    m_codes = torch.randint(-127, 128, (numel,), generator=gen, dtype=torch.int8)
    v_codes = torch.randint(0, 256, (numel,), generator=gen, dtype=torch.uint8)
    m_codes[-40:], v_codes[-40:] = 0, 0
    m_scales, v_scales = torch.rand(block_count(numel, size), generator=gen), torch.rand(4, generator=gen)
    blocked = [t.clone() for t in (param, m_codes, m_scales, v_codes, v_scales)]
    values = [1e-3, 0.01, 0.9, 0.999, 1e-8, 1e-3 / (1 - 0.9**3), (1 - 0.999**3) ** 0.5]
    kernels.adamw_param(param, grad, m_codes, m_scales, v_codes, v_scales, kernels.scalars(*values), code, size)
    p, mc, ms, vc, vs = blocked
    hyper = torch.tensor(values)
    for part in zip(
        block_parts(p, size),
        block_parts(grad, size),
        block_parts(mc, size),
        scale_parts(ms, numel, size),
        block_parts(vc, size),
        scale_parts(vs, numel, size),
        strict=True,
    ):
        kernels.adamw_blocks(*part, hyper, code)
    for ours, theirs in zip((param, m_codes, m_scales, v_codes, v_scales), blocked, strict=True):
        assert torch.equal(ours, theirs)


def test_hyperparameters_are_cpu_scalars_made_once_per_group_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = [torch.nn.Parameter(torch.randn(n)) for n in (300, 700, 5000)]
    groups = [{"params": weights[:2]}, {"params": weights[2:], "lr": 1e-2}]
    optimizer = Int8AdamW(groups, min_numel=0, block_size=256)
    optimizer.use_kernels, optimizer.per_param_kernels = True, True
    hypers, made = [], []
    run_kernel, scalars, tensor = kernels.run_kernel, kernels.scalars, torch.tensor
    monkeypatch.setattr(kernels, "run_kernel", lambda k, c, *a: hypers.append(a[6]) or run_kernel(k, c, *a))
    monkeypatch.setattr(kernels, "scalars", lambda *v: made.append(v) or scalars(*v))

    def no_device_tensor(*args: object, **kwargs: object) -> torch.Tensor:
        assert torch.device(kwargs.get("device") or "cpu").type == "cpu", "a device tensor made in step()"
        return tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", no_device_tensor)
    for _ in range(2):
        for weight in weights:
            weight.grad = torch.randn_like(weight)
        optimizer.step()
    assert len(made) == 4  # 2 groups x 2 steps, not one per parameter
    assert hypers[0] is hypers[1] and hypers[1] is not hypers[2]
    assert all(isinstance(h, torch.Tensor) and h.dim() == 0 and h.device.type == "cpu" for h in hypers[0])


def test_state_stays_under_two_point_oh_five_bytes_per_param() -> None:
    model = torch.nn.Linear(1024, 256)
    optimizer = Int8AdamW(model.named_parameters())
    optimizer.per_param_kernels = True
    model(torch.randn(4, 1024)).square().mean().backward()
    optimizer.step()
    assert optimizer.step_paths == {"fused": 1, "foreach": 1}  # the weight in int8, the bias in fp32
    assert optimizer_state_bytes(optimizer)["per_param"] <= 2.05


def _fp32_twins(make: object, steps: int = 4) -> tuple[list[torch.Tensor], list[torch.Tensor], object]:
    gen = torch.Generator().manual_seed(3)
    starts = [torch.randn(shape, generator=gen) for shape in ((16, 8), (33,), (5, 5))]
    runs = []
    for use_foreach in (True, False):
        params = [torch.nn.Parameter(s.clone()) for s in starts]
        optimizer = make(params)  # type: ignore[operator]
        optimizer.use_foreach = use_foreach
        for step in range(steps):
            gen = torch.Generator().manual_seed(step)
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            if isinstance(optimizer, Int8Sophia) and optimizer.hessian_due():
                optimizer.update_hessian({p: torch.randn(p.shape, generator=gen).abs() for p in params})
            optimizer.step()
        runs.append((params, optimizer))
    return runs[0][0], runs[1][0], runs[0][1]


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: Int8AdamW(ps, lr=1e-2, state="fp32"),
        lambda ps: Int8SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1, state="fp32"),
        lambda ps: Int8SGD(ps, lr=0.1, nesterov=True, state="fp32"),
        lambda ps: Int8SGD(ps, lr=0.1, momentum=0.0),
        lambda ps: Int8Lion(ps, lr=1e-2, weight_decay=0.1),
        lambda ps: Int8Sophia(ps, lr=1e-2, update_period=2),
    ],
    ids=["adamw", "sgd", "sgd-nesterov", "sgd-no-momentum", "lion", "sophia"],
)
def test_foreach_update_matches_the_per_op_path(make: object) -> None:
    ours, reference, optimizer = _fp32_twins(make)
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert optimizer.step_paths == {"foreach": 3}
    assert all(int(s["step"]) == 4 for s in optimizer.state.values())


def test_per_param_kernels_trace_whole_and_do_not_recompile_when_lr_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    compiles = []

    def backend(graph: torch.fx.GraphModule, inputs: list) -> object:
        compiles.append(len(inputs))
        return graph.forward

    compile_ = torch.compile
    torch._dynamo.reset()  # compiles counted here only: not a cache entry another test of this worker left
    monkeypatch.setattr(kernels.torch, "compile", lambda fn, options, **kw: compile_(fn, backend=backend, **kw))
    monkeypatch.setattr(kernels, "_COMPILED", {})
    monkeypatch.setattr(kernels, "_FAILED", set())
    weight, plain = torch.nn.Parameter(torch.ones(64, 130)), torch.nn.Parameter(torch.ones(64, 130))
    optimizer, reference = (
        Int8AdamW([weight], min_numel=0, block_size=256),
        Int8AdamW([plain], min_numel=0, block_size=256),
    )
    optimizer.per_param_kernels, optimizer.compiled = True, True
    reference.use_kernels = False
    for step in range(3):
        for opt in (optimizer, reference):
            opt.param_groups[0]["lr"] = 1e-3 * (step + 1)  # as a scheduler does
        weight.grad = torch.randn(64, 130)
        plain.grad = weight.grad.clone()
        optimizer.step()
        reference.step()
    assert not kernels._FAILED and list(kernels._COMPILED) == [kernels.adamw_param]
    assert len(compiles) == 1  # one graph (fullgraph), compiled once for all three learning rates
    torch.testing.assert_close(weight, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_inductor_compiled_per_param_kernel_matches_the_eager_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_COMPILED", {})
    monkeypatch.setattr(kernels, "_FAILED", set())
    fused, plain, opt_fused, opt_plain = _twins("adamw", (64, 130))
    opt_fused.compiled = True
    for grad in _grads((64, 130), 4):
        fused.grad, plain.grad = grad.clone(), grad.clone()
        opt_fused.step()
        opt_plain.step()
    assert not kernels._FAILED
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    _assert_same_state(opt_fused.state[fused], opt_plain.state[plain])
