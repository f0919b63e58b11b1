"""Cross-backend comparison on fixed samples: compare.json and compare_samples.npz.

The same seeded samples run through every backend that is available (torch FP32, ORT FP32 CPU, ORT INT8 CPU,
ORT INT8 CUDA, and any extra runner such as TensorRT). Each backend's outputs are measured against the reference
(torch FP32 when given, else ORT FP32): max-abs, mean-abs, cosine, SQNR, top-1 agreement (of class scores only),
and pass or fail against the tolerances of ``compare:``: tight for FP32 backends (only float rounding may differ),
loose for INT8 ones (quantization noise is expected; the check catches a broken artifact or backend). The Q/DQ model
is also compared with the FP32 model tensor by tensor, naming the first layer that diverges (``compare_layers``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from deploy_opt.analysis.compare_layers import compare_layers
from deploy_opt.analysis.comparison import (
    FORMAT,
    SAMPLES_FILE,
    BackendVerdict,
    ComparedModels,
    Comparison,
    ComparisonSamples,
    Runner,
)
from deploy_opt.config.build import CompareConfig
from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.evaluate import session_runner, torch_runner
from deploy_opt.evaluation.numerics import json_db, power_db
from dopt_common.errors import InputError, one_line
from dopt_common.files import atomic_path, sha256_file, write_json
from dopt_common.ort import create_session

log = logging.getLogger(__name__)

__all__ = [
    "FORMAT",
    "SAMPLES_FILE",
    "CompareConfig",
    "ComparedModels",
    "Comparison",
    "compare_backends",
    "fixed_samples",
    "write_comparison",
]


def fixed_samples(batches: Iterable[Batch], count: int, seed: int) -> dict[str, np.ndarray]:
    """``count`` rows drawn with ``seed`` from the whole stream (reservoir sampling), kept in stream order.

    The same stream and seed give the same rows. Rows whose trailing shapes differ (per-batch padded sequences)
    are zero-padded to the largest: every backend sees the same arrays, which is all a comparison needs.
    """
    if count <= 0:
        raise InputError(f"compare.samples must be positive, got {count}")
    rng = np.random.default_rng(seed)
    kept: list[tuple[int, dict[str, np.ndarray]]] = []
    position = 0
    for batch in batches:
        for row in range(batch.size):
            if position < count:
                kept.append((position, {k: v[row].copy() for k, v in batch.inputs.items()}))
            else:
                slot = int(rng.integers(0, position + 1))
                if slot < count:
                    kept[slot] = (position, {k: v[row].copy() for k, v in batch.inputs.items()})
            position += 1
    if not kept:
        raise InputError("the evaluation data yielded no samples to compare; fix data.evaluation")
    rows = [r for _, r in sorted(kept, key=lambda item: item[0])]
    return {name: _stack([r[name] for r in rows], name) for name in rows[0]}


def _stack(rows: list[np.ndarray], name: str) -> np.ndarray:
    shape = tuple(max(sizes) for sizes in zip(*(r.shape for r in rows), strict=True))
    if any(r.shape != shape for r in rows):
        log.info("compare samples: input '%s' zero-padded to %s (rows of differently shaped batches)", name, shape)
        rows = [np.pad(r, [(0, s - n) for n, s in zip(r.shape, shape, strict=True)]) for r in rows]
    return np.stack(rows)


def compare_backends(
    models: ComparedModels,
    samples: dict[str, np.ndarray],
    out_dir: str | Path,
    *,
    config: CompareConfig,
    seed: int | None = None,
) -> Comparison:
    """Run ``samples`` on every available backend and per layer; write compare.json and return its record."""
    started = time.perf_counter()
    fp32_path, int8_path = Path(models.fp32_path), Path(models.int8_path)
    graph = onnx.load(str(fp32_path), load_external_data=False).graph
    output_names = [o.name for o in graph.output]
    batch_size = _fixed_batch(graph) or config.batch_size
    total = len(next(iter(samples.values())))
    keep = max(total - total % batch_size, min(total, batch_size))  # whole batches for a fixed batch size
    samples = {k: v[:keep] for k, v in samples.items()}
    runners = _runners(fp32_path, int8_path, models.torch_model, models.extra_runners, models.threads)
    reference = "torch_fp32" if models.torch_model is not None else "ort_fp32_cpu"
    outputs: dict[str, list[np.ndarray]] = {}
    backends: dict[str, BackendVerdict] = {}
    for name, runner in runners.items():
        if isinstance(runner, str):
            backends[name] = BackendVerdict(runner, precision_of(name), None)
            continue
        try:
            outputs[name] = _run(runner, samples, batch_size)
        except Exception as exc:  # a backend that breaks on the samples is a finding, not a crash
            status = f"failed: {type(exc).__name__}: {one_line(exc)}"
            backends[name] = BackendVerdict(status, precision_of(name), False)
    if reference not in outputs:
        raise InputError(f"the reference backend {reference} could not run: {backends[reference].status}")
    for name, outs in outputs.items():
        backends[name] = _judge(
            name == reference, outputs[reference], outs, output_names, config, name, models.judge_top1
        )
    backends = {name: backends[name] for name in runners}  # in the runners' order
    layers = compare_layers(
        fp32_path, int8_path, samples, dataclasses.replace(config, batch_size=batch_size), models.threads
    )
    failures = [f"{name}: {'; '.join(b.failures)}" for name, b in backends.items() if b.failures]
    failures += [f"{name}: {b.status}" for name, b in backends.items() if b.status.startswith("failed")]
    first = layers["first_divergence"]
    if first:
        failures.append(f"layer '{first['tensor']}' (node '{first['node']}') diverges: {first['reason']}")
    record = Comparison(
        seed=seed,
        reference=reference,
        outputs=tuple(output_names),
        backends=backends,
        layer_status=layers["status"],
        layer_criterion=layers["criterion"],
        first_divergence=first,
        layers=tuple(layers["layers"]),
        tolerances={k: v for k, v in vars(config).items() if k not in ("enabled", "samples", "seed", "batch_size")},
        failures=tuple(failures),
        timings_s=round(time.perf_counter() - started, 2),
    )
    return write_comparison(out_dir, record, samples)


def precision_of(name: str) -> str:
    """A backend's tolerance class, from its name."""
    return "fp32" if "fp32" in name else "int8"


def write_comparison(out_dir: str | Path, record: Comparison, samples: dict[str, np.ndarray]) -> Comparison:
    """Write compare_samples.npz and compare.json (atomically) into ``out_dir``; return the record as written."""
    folder = Path(out_dir)
    with atomic_path(folder / SAMPLES_FILE) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **samples)
    record = dataclasses.replace(
        record,
        samples=ComparisonSamples(
            file=SAMPLES_FILE,
            sha256=sha256_file(folder / SAMPLES_FILE),
            count=int(next(iter(samples.values())).shape[0]),
            inputs={k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in samples.items()},
        ),
    )
    write_json(folder / "compare.json", record.to_json())
    log.info("compare.json: %s (%s)", record.verdict, "; ".join(record.failures) or "all within")
    return record


def _runners(
    fp32_path: Path, int8_path: Path, torch_model: Any, extra: Mapping[str, Runner], threads: int | None
) -> dict[str, Runner | str]:
    """Every backend: a runner, or a string saying why it is not available."""
    runners: dict[str, Runner | str] = {}
    fp32 = create_session(fp32_path, threads=threads)
    if torch_model is not None:
        runners["torch_fp32"] = torch_runner(torch_model, [i.name for i in fp32.get_inputs()])
    runners["ort_fp32_cpu"] = session_runner(fp32)
    runners["ort_int8_cpu"] = session_runner(create_session(int8_path, threads=threads))
    runners["ort_int8_cuda"] = _provider_runner(int8_path, threads, "CUDAExecutionProvider")
    # The CUDA EP runs the Q/DQ model in float; ORT's TensorRT EP hands it to TensorRT, which runs it in INT8.
    runners["ort_int8_tensorrt_ep"] = _provider_runner(int8_path, threads, "TensorrtExecutionProvider")
    runners |= dict(extra)
    if not any(name.startswith("tensorrt") for name in extra):
        runners["tensorrt_int8"] = (
            "not available: the tensorrt package is not installed"
            if importlib.util.find_spec("tensorrt") is None
            else "not available: no TensorRT engine was given to compare (extra runner 'tensorrt_int8')"
        )
    return runners


def _provider_runner(int8_path: Path, threads: int | None, provider: str) -> Runner | str:
    """The Q/DQ model on one ORT execution provider, or why not (the provider missing, or a silent CPU fallback)."""
    import onnxruntime

    providers = onnxruntime.get_available_providers()
    if provider not in providers:
        return f"not available: {provider} is not in onnxruntime's providers {providers}"
    try:
        session = create_session(int8_path, threads=threads, providers=(provider,))
    except Exception as exc:  # CUDA or TensorRT libraries missing, or no device: ORT says why
        return f"not available: {type(exc).__name__}: {one_line(exc)}"
    if session.get_providers()[0] != provider:
        return f"not available: the session fell back to {session.get_providers()}"
    return session_runner(session)


def _fixed_batch(graph: onnx.GraphProto) -> int | None:
    """The batch size a graph input fixes on axis 0 (an exported file with batch 1), or None when dynamic."""
    inits = {i.name for i in graph.initializer}
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in inits and dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            return int(dims[0].dim_value)
    return None


def _run(runner: Runner, samples: dict[str, np.ndarray], batch_size: int) -> list[np.ndarray]:
    total = next(iter(samples.values())).shape[0]
    parts = [
        [np.asarray(o) for o in runner({k: v[s : s + batch_size] for k, v in samples.items()})]
        for s in range(0, total, batch_size)
    ]
    return [np.concatenate(chunk) for chunk in zip(*parts, strict=True)]


def _judge(
    is_reference: bool,
    reference: list[np.ndarray],
    outputs: list[np.ndarray],
    names: list[str],
    config: CompareConfig,
    backend: str,
    judge_top1: bool,
) -> BackendVerdict:
    """Per-output metrics against the reference and the backend's pass/fail."""
    precision = precision_of(backend)
    if is_reference:
        return BackendVerdict("ran", precision, True, reference=True)
    if len(outputs) != len(reference):
        return BackendVerdict(
            "ran", precision, False, failures=(f"{len(outputs)} outputs, the reference has {len(reference)}",)
        )
    if len(names) != len(reference):
        names = [str(i) for i in range(len(reference))]
    metrics = {
        name: output_metrics(ref, out, class_scores=judge_top1)
        for name, ref, out in zip(names, reference, outputs, strict=True)
    }
    min_sqnr = config.fp32_min_sqnr_db if precision == "fp32" else config.int8_min_sqnr_db
    min_cos = config.fp32_min_cosine if precision == "fp32" else config.int8_min_cosine
    failures = []
    for name, m in metrics.items():
        if "error" in m:
            failures.append(f"{name}: {m['error']}")
            continue
        if m["sqnr_db"] is not None and m["sqnr_db"] < min_sqnr:
            failures.append(f"{name}: SQNR {m['sqnr_db']:.1f} dB < {min_sqnr}")
        if m["cosine"] < min_cos:
            failures.append(f"{name}: cosine {m['cosine']:.5f} < {min_cos}")
        if judge_top1 and m["top1_agreement"] is not None and m["top1_agreement"] < config.min_top1_agreement:
            failures.append(f"{name}: top-1 agreement {m['top1_agreement']:.3f} < {config.min_top1_agreement}")
    return BackendVerdict("ran", precision, not failures, outputs=metrics, failures=tuple(failures))


def output_metrics(reference: np.ndarray, test: np.ndarray, class_scores: bool = True) -> dict[str, Any]:
    """max-abs, mean-abs, cosine (mean and min over samples), SQNR (dB), and top-1 agreement of class scores.

    ``class_scores`` False (an embedding, a detector's boxes): no top-1 agreement, since its argmax is no prediction.
    """
    if reference.shape != test.shape:
        return {"error": f"shape {list(test.shape)}, the reference has {list(reference.shape)}"}
    a, b = reference.astype(np.float64), test.astype(np.float64)
    if not np.all(np.isfinite(b)):
        return {"error": "NaN or Inf in the output"}
    diff = np.abs(a - b)
    rows_a, rows_b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    norms = np.linalg.norm(rows_a, axis=1) * np.linalg.norm(rows_b, axis=1)
    both_zero = norms == 0
    cosines = np.where(both_zero, 1.0, (rows_a * rows_b).sum(axis=1) / np.maximum(norms, 1e-30))
    noise, signal = float((diff**2).sum()), float((a**2).sum())
    top1 = None
    if class_scores and a.ndim >= 2 and a.shape[-1] > 1:
        top1 = float(np.mean(a.argmax(axis=-1) == b.argmax(axis=-1)))
    return {
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "mean_abs": float(diff.mean()) if diff.size else 0.0,
        "cosine": float(cosines.mean()),
        "cosine_min": float(cosines.min()),
        "sqnr_db": json_db(power_db(signal, noise)),
    } | ({"top1_agreement": top1} if class_scores else {})
