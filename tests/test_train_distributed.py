"""Int8AdamW under torch.distributed (gloo, 2 CPU processes): ZeRO-1 and FSDP2 match a single-process run.

One spawn runs four distributed trainings (ZeRO-1 and FSDP2, each with int8 and with fp32 state) on the same
seeded data as the single-process reference: every step, rank r gets half of the reference's batch, so the
averaged gradient is the reference gradient up to summation order.

Tolerances are relative to the int8 noise measured in the same test: ``noise`` = how far the single-process int8
run ends from the single-process fp32 run (20 AdamW steps at lr 1e-2; measured max |dw| 4.9e-3, mean 5.2e-4).
- fp32 state: only the gradient summation order differs; measured max |dw| 9e-8, bound 1e-6.
- ZeRO-1, int8: a rank owns whole parameters, so its blocks are the reference's blocks; only the summation order
  differs, which now and then moves a code by one step. Measured max |dw| 1.3e-4 (0.03 x noise), mean 2e-8;
  bound 0.1 x noise. Consolidation must move codes and scales verbatim (checked bit for bit in the workers); the
  loaded codes equal the reference's but for one-step moves (measured 1 of 20,000 codes; bound 0.1 %).
- FSDP2, int8: each rank quantizes its own dim-0 shard, so the block boundaries differ from the reference's (the
  test model's shapes and block size 256 make them differ on purpose): its quantization noise is independent of
  the reference's, so it cannot match it closer than ``noise``. Instead it must be as close to the fp32 run as
  the single-process int8 run is: measured 1.1 x noise (max) and 1.01 x (mean); bounds 2 x and 1.5 x. A scale
  applied to the wrong shard's codes or a lost moment moves weights by ~lr per step, far outside these.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from deploy_opt.train.distributed import fsdp_state_dict, zero_state_dict
from deploy_opt.train.optimizers import Int8AdamW
from deploy_opt.train.state_io import CONFIG_KEY

WORLD = 2
STEPS = 20
BATCH = 16  # global; each rank takes BATCH // WORLD rows
OPTIONS = {"lr": 1e-2, "weight_decay": 0.01, "block_size": 256, "min_numel": 1024}
RUNS = [("zero", "int8"), ("zero", "fp32"), ("fsdp", "int8"), ("fsdp", "fp32")]

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")


def make_model() -> nn.Module:
    """Shapes whose dim-0 shards do not split on block boundaries (3000 and 7000 elements, blocks of 256)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(30, 100), nn.Tanh(), nn.Linear(100, 70), nn.Tanh(), nn.Linear(70, 10))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, 30, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator))
        for _ in range(STEPS)
    ]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def train_single(state: str) -> tuple[dict[str, torch.Tensor], Int8AdamW]:
    """The reference: one process, the whole batch."""
    model = make_model()
    optimizer = Int8AdamW(model.parameters(), state=state, **OPTIONS)
    for x, y in batches():
        optimizer.zero_grad()
        loss_of(model, x, y).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, optimizer


def _train_zero(rank: int, state: str) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(make_model())
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=Int8AdamW, state=state, **OPTIONS)
    for x, y in batches():
        rows = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        optimizer.zero_grad()
        loss_of(model, x[rows], y[rows]).backward()
        optimizer.step()
    local = {id(p): s for p, s in optimizer.optim.state.items()}
    full = zero_state_dict(optimizer, to=0)
    params = list(model.module.parameters())
    # Each rank checks that consolidation moved its codes and scales verbatim.
    if full is not None:
        for index, param in enumerate(params):
            if id(param) in local:
                for key, value in local[id(param)].items():
                    assert torch.equal(full["state"][index][key], value), (index, key)
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(
        gathered, {i: {k: v for k, v in local[id(p)].items()} for i, p in enumerate(params) if id(p) in local}
    )
    if full is not None:
        for rank_state in gathered:
            for index, param_state in rank_state.items():
                for key, value in param_state.items():
                    assert torch.equal(full["state"][index][key], value), (index, key)
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}, full


def _train_fsdp(rank: int, state: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = Int8AdamW(model.parameters(), state=state, **OPTIONS)
    for x, y in batches():
        rows = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        optimizer.zero_grad()
        loss_of(model, x[rows], y[rows]).backward()
        optimizer.step()
    if state == "int8":  # each rank really holds int8 codes for its shards
        assert any(key.endswith("_codes") for s in optimizer.state.values() for key in s)
    full_state = fsdp_state_dict(optimizer)
    weights = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    return weights, full_state


def _worker(rank: int, folder: str) -> None:
    torch.set_num_threads(1)
    # A file rendezvous, not a TCP port: a port found free and closed again can be taken by another test process
    # (pytest -n 2) before rank 0 binds it, which aborted the workers.
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=WORLD)
    try:
        for engine, state in RUNS:
            weights, optimizer_state = (_train_zero if engine == "zero" else _train_fsdp)(rank, state)
            if rank == 0:
                torch.save({"weights": weights, "optimizer": optimizer_state}, Path(folder) / f"{engine}-{state}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def distributed_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("distributed")
    try:
        mp.spawn(_worker, args=(str(folder),), nprocs=WORLD, join=True)
    except mp.ProcessExitedException as error:
        # A rank killed by a signal (gloo aborting on a transport error on a loaded 2-core CI runner, seen once in
        # ~10 runs) says nothing of the optimizer: run once more from a fresh rendezvous. A worker's failed check
        # raises a Python exception (ProcessRaisedException), which is never retried.
        if not error.signal_name:
            raise
        warnings.warn(f"distributed rank died by {error.signal_name}; rerunning the spawn once", stacklevel=1)
        folder = tmp_path_factory.mktemp("distributed-retry")
        mp.spawn(_worker, args=(str(folder),), nprocs=WORLD, join=True)
    return {run: torch.load(folder / f"{run[0]}-{run[1]}.pt", weights_only=True) for run in RUNS}


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[dict[str, torch.Tensor], Int8AdamW]]:
    return {state: train_single(state) for state in ("int8", "fp32")}


def differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The largest and the mean absolute difference over all tensors (the mean is over tensors' means)."""
    assert a.keys() == b.keys()
    return (max(float((a[k] - b[k]).abs().max()) for k in a), max(float((a[k] - b[k]).abs().mean()) for k in a))


@pytest.fixture(scope="module")
def noise(references: dict) -> tuple[float, float]:
    """How far int8 state moves a single-process run from the fp32 one (max, mean |dw|)."""
    measured = differences(references["int8"][0], references["fp32"][0])
    assert measured[0] > 1e-4  # int8 state really was used
    return measured


@pytest.mark.parametrize("engine", ["zero", "fsdp"])
@pytest.mark.slow
def test_fp32_state_matches_single_process(distributed_runs: dict, references: dict, engine: str) -> None:
    biggest, _ = differences(distributed_runs[(engine, "fp32")]["weights"], references["fp32"][0])
    assert biggest < 1e-6


@pytest.mark.slow
def test_zero_int8_matches_single_process(distributed_runs: dict, references: dict, noise: tuple) -> None:
    biggest, mean = differences(distributed_runs[("zero", "int8")]["weights"], references["int8"][0])
    assert biggest <= 0.1 * noise[0] and mean <= 0.01 * noise[1]


def test_fsdp_int8_is_as_close_to_fp32_as_single_process_int8(
    distributed_runs: dict, references: dict, noise: tuple
) -> None:
    biggest, mean = differences(distributed_runs[("fsdp", "int8")]["weights"], references["fp32"][0])
    assert biggest <= 2.0 * noise[0] and mean <= 1.5 * noise[1]


def _fp32_moments(optimizer: Int8AdamW) -> dict[int, dict[str, torch.Tensor]]:
    state = optimizer.to_fp32_state_dict()["state"]
    return {i: {k: v for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")} for i, s in state.items()}


def relative_error(moments: dict, reference: dict) -> dict[str, float]:
    """Per moment kind: the largest |difference| of any parameter, relative to that parameter's absmax."""
    out: dict[str, float] = {}
    for index, kinds in reference.items():
        for kind, value in kinds.items():
            error = float((moments[index][kind] - value).abs().max() / value.abs().max().clamp_min(1e-30))
            out[kind] = max(out.get(kind, 0.0), error)
    return out


def test_zero_consolidated_state_loads_into_a_single_process_optimizer(
    distributed_runs: dict, references: dict
) -> None:
    full = distributed_runs[("zero", "int8")]["optimizer"]
    assert full[CONFIG_KEY]["state"] == "int8" and full[CONFIG_KEY]["block_size"] == OPTIONS["block_size"]
    assert any(key.endswith("_codes") for s in full["state"].values() for key in s)  # really int8 state
    single = Int8AdamW(make_model().parameters(), state="int8", **OPTIONS)
    single.load_state_dict(full)  # no convert: the same config, the same blocks
    # The same codes as the single-process run's, but where the gradient's summation order moved one by a step
    reference = references["int8"][1].state_dict()["state"]
    moved = total = 0
    for index, kinds in single.state_dict()["state"].items():
        for key, codes in kinds.items():
            if key.endswith("_codes"):
                step = (codes.int() - reference[index][key].int()).abs()
                assert int(step.max()) <= 1, (index, key)
                moved, total = moved + int(step.sum()), total + step.numel()
    assert total > 0 and moved <= 1e-3 * total, (moved, total)


def test_fsdp_gathered_state_matches_single_process_moments(distributed_runs: dict, references: dict) -> None:
    full = distributed_runs[("fsdp", "int8")]["optimizer"]
    assert full[CONFIG_KEY]["state"] == "fp32"  # gathered in fp32: shard scales never mix
    gathered = {i: {k: v for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")} for i, s in full["state"].items()}
    fp32 = _fp32_moments(references["fp32"][1])
    assert all(gathered[i][k].shape == v.shape for i, kinds in fp32.items() for k, v in kinds.items())
    # The gathered moments are as close to the fp32 run's as the single-process int8 run's are (measured 1.09x).
    int8_noise = relative_error(_fp32_moments(references["int8"][1]), fp32)
    for kind, error in relative_error(gathered, fp32).items():
        assert error <= 2.0 * int8_noise[kind], kind
    # Re-blocked over the full tensors for one process: within one quantization step (measured <= 1/300 absmax).
    single = Int8AdamW(make_model().parameters(), state="int8", **OPTIONS)
    single.load_state_dict(full, convert=True)
    for kind, error in relative_error(_fp32_moments(single), gathered).items():
        assert error <= 1 / 64, kind
