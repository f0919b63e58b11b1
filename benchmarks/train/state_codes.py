"""Which 8-bit code keeps AdamW's second moment best, and what the int8 step costs.

Not a test: run by hand. Three tables.

1. **Codes on real moments.** Each model is trained with ``torch.optim.AdamW`` (fp32 state) for ``--steps``
   steps on the sklearn digits; then, for every tensor that would get int8 state (>= 4096 elements), the second
   moment ``v`` is quantized block-wise (``--block-size``) with each code of
   ``deploy_opt.train.blockwise.SECOND_MOMENT_CODES`` and compared with the exact one:

   - ``v -> 0``: fraction of the nonzero ``v`` that decode to zero;
   - ``v rel err``: median and 99th percentile of ``|v_q - v| / v`` over nonzero ``v``;
   - ``update rel err``: ``||u_q - u|| / ||u||`` for the bias-corrected update ``u = m / (sqrt(v) + eps)``,
     with ``m`` exact (``m exact``) and with ``m`` in the linear int8 code too (``m int8``);
   - ``upd >10%``: fraction of elements whose update changes by more than 10 % of ``rms(u)``.

   Models: ``mlp-scratch`` (the demo's 6x1024 MLP from a seeded random init), ``mlp-finetune`` (the trained demo
   MLP, ``deploy_opt.demo.digits:build_model``, fine-tuned on the calibration split) and ``transformer`` (two
   ``nn.TransformerEncoderLayer`` (d=64, 4 heads) reading each 8x8 digit as 8 tokens).
2. **Training with each code.** ``Int8AdamW(second_moment_code=...)`` vs ``state="fp32"`` from the same init
   for ``--steps`` steps: the loss over the whole split afterwards.
3. **Step time** of ``optimizer.step()`` on the demo MLP (6.4 M parameters), rounds interleaving all rows:
   ``torch.optim.AdamW(foreach=True)`` vs ``Int8AdamW`` with fp32 state, and with int8 state per second-moment
   code: the per-op path (the default), the fused kernels run eagerly, and ``compiled=True``. The first step's
   time shows the one-off ``torch.compile`` cost.

    python benchmarks/train/state_codes.py                      # all three tables
    python benchmarks/train/state_codes.py --tables codes --steps 50
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

import torch

from deploy_opt.train import blockwise
from deploy_opt.train.optimizers import Int8AdamW, optimizer_state_bytes
from dopt_common.timer import fixed, median_ms, time_rounds

MIN_NUMEL = 4096


def _digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    from deploy_opt.demo import digits

    x, y = digits._splits()[split]
    return torch.from_numpy(x), torch.from_numpy(y)


class _DigitsTransformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_rows = torch.nn.Linear(8, 64)
        layer = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed_rows(x.view(-1, 8, 8))).mean(dim=1))


def build(name: str) -> tuple[torch.nn.Module, str, float]:
    """(model, data split, learning rate) of one benchmark model."""
    from deploy_opt.demo import digits

    torch.manual_seed(0)
    if name == "mlp-scratch":
        return digits._architecture(), "train", 1e-3
    if name == "mlp-finetune":
        return digits.build_model().train(), "calibration", 1e-4
    return _DigitsTransformer(), "train", 1e-3


def train(model: torch.nn.Module, split: str, optimizer: torch.optim.Optimizer, steps: int) -> float:
    """``steps`` steps on mini-batches of 128 in a fixed order; then the loss over the whole split."""
    x, y = _digits(split)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (128,), generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(x), y).item()


def code_errors(optimizer: torch.optim.AdamW, block_size: int) -> dict[str, dict[str, float]]:
    """Per code, the errors of v and of the update pooled over every tensor with int8 state."""
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    eps = optimizer.param_groups[0]["eps"]
    keys = ("v", "v_q", "u", "u_zero", "u_read", "u_both")
    acc: dict[str, dict[str, list[torch.Tensor]]] = {c: {k: [] for k in keys} for c in blockwise.SECOND_MOMENT_CODES}
    for state in optimizer.state.values():
        m, v = state["exp_avg"].reshape(-1), state["exp_avg_sq"].reshape(-1)
        if m.numel() < MIN_NUMEL:
            continue
        step = float(state["step"])
        bc1, bc2 = 1 - beta1**step, 1 - beta2**step
        m_q = blockwise.dequantize_signed(*blockwise.quantize_signed(m, block_size), block_size)
        u = (m / bc1) / ((v / bc2).sqrt() + eps)
        for code in blockwise.SECOND_MOMENT_CODES:
            codes, scales = blockwise.quantize_unsigned(v, block_size, code)
            v_q = blockwise.dequantize_unsigned(codes, scales, block_size, code)
            # what the optimizers read: a code 0 is half a step, not 0
            v_read = blockwise.dequantize_unsigned(codes, scales, block_size, code, zero_as_half_step=True)
            values = {
                "v": v,
                "v_q": v_q,
                "u": u,
                "u_zero": (m / bc1) / ((v_q / bc2).sqrt() + eps),
                "u_read": (m / bc1) / ((v_read / bc2).sqrt() + eps),
                "u_both": (m_q / bc1) / ((v_read / bc2).sqrt() + eps),
            }
            for key, value in values.items():
                acc[code][key].append(value)
    out = {}
    for code, parts in acc.items():
        v, v_q, u, u_zero, u_read, u_both = (torch.cat(parts[k]) for k in keys)
        nonzero = v > 0
        rel = ((v_q - v).abs() / v)[nonzero]
        out[code] = {
            "zeroed": (v_q[nonzero] == 0).float().mean().item(),
            "v_med": rel.median().item(),
            "v_p99": rel[:: max(1, rel.numel() // 2**23)].quantile(0.99).item(),  # quantile() caps its input size
            "u_zero": ((u_zero - u).norm() / u.norm()).item(),
            "u_read": ((u_read - u).norm() / u.norm()).item(),
            "u_both": ((u_both - u).norm() / u.norm()).item(),
            "u_gt10": ((u_both - u).abs() > 0.1 * u.square().mean().sqrt()).float().mean().item(),
            "v_decades": (v[nonzero].max().log10() - v[nonzero].min().log10()).item(),
        }
    return out


def table_codes(models: list[str], steps: int, block_size: int) -> None:
    print(f"\n## second-moment codes: {steps} AdamW steps, block {block_size}, tensors >= {MIN_NUMEL} elements\n")
    print(
        "update rel err = ||u_q - u|| / ||u||, u = m / (sqrt(v) + eps) bias-corrected; 'v 0 as 0': a v that"
        " rounds to 0 read as 0; 'read': as the optimizers read it (code 0 = half a step); 'm int8 too': m in"
        " the linear int8 code as well (what Int8AdamW does)\n"
    )
    print(
        "| model | code | v -> 0 | v rel err median | v rel err p99 | update err, m exact, v 0 as 0 |"
        " update err, m exact, read | update err, m int8 too | elements off >10% rms(u) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in models:
        model, split, lr = build(name)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        train(model, split, optimizer, steps)
        for code, row in code_errors(optimizer, block_size).items():
            print(
                f"| {name} (v spans {row['v_decades']:.0f} decades) | {code} | {row['zeroed']:.2%} |"
                f" {row['v_med']:.3f} | {row['v_p99']:.3f} | {row['u_zero']:.4g} | {row['u_read']:.4g} |"
                f" {row['u_both']:.4g} | {row['u_gt10']:.3%} |"
            )


def table_training(models: list[str], steps: int, block_size: int) -> None:
    print(f"\n## training {steps} steps with each code (block {block_size}): loss on the whole split after\n")
    print("| model | fp32 state | " + " | ".join(f"int8, v {c}" for c in blockwise.SECOND_MOMENT_CODES) + " |")
    print("|---|---|" + "---|" * len(blockwise.SECOND_MOMENT_CODES))
    for name in models:
        model, split, lr = build(name)
        cells = []
        for kwargs in [{"state": "fp32"}] + [{"second_moment_code": c} for c in blockwise.SECOND_MOMENT_CODES]:
            twin = copy.deepcopy(model)
            optimizer = Int8AdamW(twin.named_parameters(), lr=lr, block_size=block_size, **kwargs)
            cells.append(f"{train(twin, split, optimizer, steps):.4f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def _eager_kernels(optimizer: Int8AdamW) -> Int8AdamW:
    optimizer.use_kernels = True
    return optimizer


class _Timed:
    """One optimizer on its own copy of the demo MLP, with two fixed sets of gradients to alternate."""

    def __init__(self, make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]) -> None:
        from deploy_opt.demo import digits

        torch.manual_seed(0)
        self.params = list(digits._architecture().parameters())
        gen = torch.Generator().manual_seed(0)
        self.grads = [[torch.randn(p.shape, generator=gen) * 1e-3 for p in self.params] for _ in range(2)]
        self.optimizer = make(self.params)
        self.steps = 0

    def step(self) -> None:
        """One step on the next set of gradients (a run for the timer: setting ``.grad`` is a few pointer moves)."""
        for p, g in zip(self.params, self.grads[self.steps % 2], strict=True):
            p.grad = g
        self.steps += 1
        self.optimizer.step()


def table_step_time(repeats: int, block_size: int, compiled: bool) -> None:
    print(
        f"\n## optimizer.step() on the demo MLP (6.4 M params), {torch.get_num_threads()} threads,"
        f" median of {repeats} rounds after 3 warm-up rounds; each round steps every optimizer once\n"
    )
    print("| optimizer | step ms | x torch AdamW | first step s | state bytes/param |")
    print("|---|---|---|---|---|")
    rows: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
        "torch.optim.AdamW(foreach=True)": lambda ps: torch.optim.AdamW(ps, foreach=True),
        "Int8AdamW(state='fp32')": lambda ps: Int8AdamW(ps, state="fp32"),
    }
    for code in blockwise.SECOND_MOMENT_CODES[:2]:
        rows[f"Int8AdamW(v {code})"] = lambda ps, c=code: Int8AdamW(ps, block_size=block_size, second_moment_code=c)
        rows[f"Int8AdamW(v {code}), fused kernels eagerly"] = lambda ps, c=code: _eager_kernels(
            Int8AdamW(ps, block_size=block_size, second_moment_code=c)
        )
        if compiled:
            rows[f"Int8AdamW(v {code}, compiled=True)"] = lambda ps, c=code: Int8AdamW(
                ps, block_size=block_size, second_moment_code=c, compiled=True
            )
    timed = {label: _Timed(make) for label, make in rows.items()}
    # interleaved rounds (the one timer), so that load from other processes hits every row alike; the first 3 are
    # the warm-up, kept for the first step's time (compilation) and left out of the median
    times = time_rounds({label: entry.step for label, entry in timed.items()}, fixed(repeats + 3))
    base = None
    for label, entry in timed.items():
        ms = median_ms(times[label][3:])
        base = base or ms
        per_param = optimizer_state_bytes(entry.optimizer)["per_param"]
        print(f"| {label} | {ms:.1f} | {ms / base:.2f} | {times[label][0] / 1e3:.2f} | {per_param:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tables", nargs="+", default=["codes", "training", "time"], choices=["codes", "training", "time"]
    )
    parser.add_argument("--models", nargs="+", default=["mlp-scratch", "mlp-finetune", "transformer"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--block-size", type=int, default=blockwise.DEFAULT_BLOCK_SIZE)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows of the time table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if "codes" in args.tables:
        table_codes(args.models, args.steps, args.block_size)
    if "training" in args.tables:
        table_training(args.models, args.steps, args.block_size)
    if "time" in args.tables:
        table_step_time(args.repeats, args.block_size, not args.no_compile)


if __name__ == "__main__":
    main()
