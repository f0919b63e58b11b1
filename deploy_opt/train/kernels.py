"""Fused dequantize -> update -> requantize over blocks, one function per optimizer.

Each ``*_blocks`` kernel takes a parameter and its gradient viewed as ``[blocks, block_size]`` (fp32; a shorter
tail block is a second call with ``[1, tail]``), the moments' codes (same view) and scales (``[blocks]``), and
``hyper``: the step's scalars as one fp32 tensor, so that a compiled kernel is not recompiled when the learning
rate changes. They write the parameter, codes and scales in place and give the same numbers as the unfused path
in ``optimizers.py`` (dequantize, update, ``blockwise.quantize``). That is the CPU path.

On CUDA each parameter is one call of a ``*_param`` kernel instead: the flat parameter, gradient (any float
dtype) and codes, the tail block a static slice inside the same graph (not a second call), and ``hyper`` a
tuple of 0-d CPU tensors computed once per group and step (``scalars``), which Inductor reads as kernel
arguments: no host-to-device copy per call. They are compiled with ``dynamic=False`` (no shape guards to pay
for; one compilation per distinct parameter size), as torchao's 8-bit optimizers are.

The optimizers use them only compiled (``compiles()`` in ``optimizers.py``): ``run_kernel`` wraps them in
``torch.compile`` (Inductor fuses the step into a few loops over the blocks), falling back to eager if compiling
fails. The dynamic code decodes and encodes by arithmetic (``dynamic_code``), not table lookups, which Inductor
compiles to a scalar gather per element. Measured by ``benchmarks/train/optimizers.py`` (defaults, 2 threads,
Xeon with AVX-512 VNNI and AMX) on all-MiniLM-L6-v2's 22.7M parameters, the optimizer step alone: torch AdamW
(foreach) 76.7 ms; compiled ``dynamic`` 78.5 ms (1.02x; 124 ms, 1.65x, with the table lookups), compiled ``sqrt``
45.0 ms; the whole training step 1.01x. Run eagerly the kernels allocate more temporaries than the per-op path
and are slower.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from deploy_opt.train import dynamic_code
from deploy_opt.train.blockwise import SCALE_FLOOR, block_parts, scale_parts

log = logging.getLogger(__name__)


def _requant_signed(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    new = (x.abs().amax(dim=1) / 127.0).clamp_min(SCALE_FLOOR)
    codes.copy_((x / new.unsqueeze(1)).round().clamp(-127, 127))
    scales.copy_(new)


def _dequant_second(codes: torch.Tensor, scales: torch.Tensor, code: str) -> torch.Tensor:
    # code 0 reads as half a step, as in blockwise.dequantize_unsigned(zero_as_half_step=True)
    if code == "dynamic":  # arithmetic, the table's bits (dynamic_code): a compiled gather is scalar
        levels = dynamic_code.level(codes, zero=dynamic_code.HALF_FIRST)
        return levels * scales.unsqueeze(1)
    value = codes.float().clamp(min=0.5) * scales.unsqueeze(1)
    return value * value if code == "sqrt" else value


def _requant_second(v: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, code: str) -> None:
    if code == "sqrt":
        v = v.sqrt()
    top = v.amax(dim=1)
    new = (top if code == "dynamic" else top / 255.0).clamp_min(SCALE_FLOOR)
    y = v / new.unsqueeze(1)
    if code == "dynamic":
        codes.copy_(dynamic_code.encode(y.clamp(max=1.0)))
    else:
        codes.copy_(y.round().clamp(0, 255))
    scales.copy_(new)


def _unbound(hyper: torch.Tensor | Sequence[Any]) -> Sequence[Any]:
    # one fp32 tensor (the CPU path) or a tuple of 0-d CPU tensors / floats (the CUDA path, see ``scalars``)
    return hyper.unbind() if isinstance(hyper, torch.Tensor) else hyper


def adamw_blocks(
    param: torch.Tensor,
    grad: torch.Tensor,
    m_codes: torch.Tensor,
    m_scales: torch.Tensor,
    v_codes: torch.Tensor,
    v_scales: torch.Tensor,
    hyper: torch.Tensor,
    code: str,
) -> None:
    """AdamW; ``hyper`` = [lr, weight_decay, beta1, beta2, eps, lr / bias_correction1, sqrt(bias_correction2)]."""
    lr, wd, beta1, beta2, eps, step_size, bc2_sqrt = _unbound(hyper)
    m = m_codes.float() * m_scales.unsqueeze(1)
    v = _dequant_second(v_codes, v_scales, code)
    m = torch.lerp(m, grad, 1.0 - beta1)
    v = v * beta2 + grad * grad * (1.0 - beta2)
    param.copy_(param * (1.0 - lr * wd) - step_size * m / (v.sqrt() / bc2_sqrt + eps))
    _requant_signed(m, m_codes, m_scales)
    _requant_second(v, v_codes, v_scales, code)


def lion_blocks(
    param: torch.Tensor, grad: torch.Tensor, m_codes: torch.Tensor, m_scales: torch.Tensor, hyper: torch.Tensor
) -> None:
    """Lion; ``hyper`` = [lr, weight_decay, beta1, beta2]."""
    lr, wd, beta1, beta2 = _unbound(hyper)
    m = m_codes.float() * m_scales.unsqueeze(1)
    param.copy_(param * (1.0 - lr * wd) - lr * torch.lerp(m, grad, 1.0 - beta1).sign())
    _requant_signed(torch.lerp(m, grad, 1.0 - beta2), m_codes, m_scales)


def sgd_blocks(
    param: torch.Tensor,
    grad: torch.Tensor,
    m_codes: torch.Tensor,
    m_scales: torch.Tensor,
    hyper: torch.Tensor,
    nesterov: bool,
) -> None:
    """SGD with momentum; ``hyper`` = [lr, weight_decay, momentum]."""
    lr, wd, momentum = _unbound(hyper)
    buf = m_codes.float() * m_scales.unsqueeze(1) * momentum + grad
    direction = grad + momentum * buf if nesterov else buf
    param.copy_(param * (1.0 - lr * wd) - lr * direction)
    _requant_signed(buf, m_codes, m_scales)


# --- one call per parameter (the CUDA path) ------------------------------------------------------------------
def scalars(*values: float) -> tuple[torch.Tensor, ...]:
    """A kernel's ``hyper``: 0-d fp32 tensors on the CPU (not guarded by ``torch.compile``; no device copy)."""
    return tuple(torch.tensor(float(value), dtype=torch.float32, device="cpu") for value in values)


def _parts(flat: torch.Tensor, numel: int, block_size: int, scales: bool = False) -> list[torch.Tensor]:
    return scale_parts(flat, numel, block_size) if scales else block_parts(flat, block_size)


# The whole blocks and the tail block are two static slices of one graph (dynamic=False fixes every shape), so a
# parameter is one compiled call. A zero-padded tail in one [blocks, block_size] view was tried first: its
# arithmetic is the same, but Inductor (torch 2.13, CPU) mis-scheduled the dynamic code's tail block that way
# (tests/test_train_optim_fused.py compiles both on the CPU).
def _on_whole_param(
    blocks: Callable[..., None],
    param: torch.Tensor,
    grad: torch.Tensor,
    moments: Sequence[tuple[torch.Tensor, torch.Tensor]],
    block_size: int,
    *after: Any,
) -> None:
    """``blocks`` on a flat parameter's whole blocks, then on its tail: parameter and gradient in fp32, each
    moment's (codes, scales) cut the same way, ``after`` (hyper, options) passed on; the parameter written back."""
    numel, work = param.numel(), param.float()
    columns = [_parts(work, numel, block_size), _parts(grad.float(), numel, block_size)]
    for codes, scales in moments:
        columns += [_parts(codes, numel, block_size), _parts(scales, numel, block_size, scales=True)]
    for part in zip(*columns, strict=True):
        blocks(*part, *after)
    if work is not param:
        param.copy_(work)


def adamw_param(
    param: torch.Tensor,
    grad: torch.Tensor,
    m_codes: torch.Tensor,
    m_scales: torch.Tensor,
    v_codes: torch.Tensor,
    v_scales: torch.Tensor,
    hyper: Sequence[Any],
    code: str,
    block_size: int,
) -> None:
    """AdamW on one whole parameter: flat ``param`` (any float dtype), ``grad`` and codes, ``[blocks]`` scales."""
    _on_whole_param(adamw_blocks, param, grad, ((m_codes, m_scales), (v_codes, v_scales)), block_size, hyper, code)


def lion_param(
    param: torch.Tensor,
    grad: torch.Tensor,
    m_codes: torch.Tensor,
    m_scales: torch.Tensor,
    hyper: Sequence[Any],
    block_size: int,
) -> None:
    """Lion on one whole parameter (see ``adamw_param``)."""
    _on_whole_param(lion_blocks, param, grad, ((m_codes, m_scales),), block_size, hyper)


def sgd_param(
    param: torch.Tensor,
    grad: torch.Tensor,
    m_codes: torch.Tensor,
    m_scales: torch.Tensor,
    hyper: Sequence[Any],
    nesterov: bool,
    block_size: int,
) -> None:
    """SGD with momentum on one whole parameter (see ``adamw_param``)."""
    _on_whole_param(sgd_blocks, param, grad, ((m_codes, m_scales),), block_size, hyper, nesterov)


_STATIC = frozenset({adamw_param, lion_param, sgd_param})  # compiled with dynamic=False
# Inductor stores an intermediate read by several loops once it takes more than 30 operations; the dynamic
# code's decoded v is read by the scale's reduction and the update, and storing it (4 bytes written and read back
# per element) cost more than computing it twice: 22.5M parameters, 2 threads, 106 -> 91 ms (sqrt code: 61 ms).
_INDUCTOR_OPTIONS = {"realize_opcount_threshold": 1000}
_COMPILED: dict[Callable[..., None], Callable[..., None]] = {}
_FAILED: set[Callable[..., None]] = set()


@contextmanager
def unlimited_recompiles() -> Iterator[None]:
    """Lift dynamo's recompile limit around a step: the ``*_param`` kernels compile once per parameter size.

    A model has a fixed set of sizes, so this cannot recompile forever (torchao's 8-bit optimizers do the same).
    """
    try:
        from torch._dynamo.utils import disable_cache_limit
    except ImportError:  # a torch without it keeps dynamo's default limit
        yield
        return
    with disable_cache_limit():
        yield


def run_kernel(kernel: Callable[..., None], compile_: bool, *args: Any) -> None:
    """Run ``kernel``; through ``torch.compile`` when ``compile_`` (once it failed to compile, eagerly)."""
    if not compile_ or kernel in _FAILED:
        kernel(*args)
        return
    compiled = _COMPILED.get(kernel)
    if compiled is None:
        compiled = _COMPILED[kernel] = torch.compile(
            kernel, dynamic=kernel not in _STATIC, fullgraph=True, options=_INDUCTOR_OPTIONS
        )
    try:
        compiled(*args)
    except Exception as exc:  # a missing C++ compiler, an unsupported platform: keep training, eagerly
        log.warning("torch.compile of %s failed (%s); running it eagerly", kernel.__name__, exc)
        _FAILED.add(kernel)
        kernel(*args)
