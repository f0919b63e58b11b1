"""The build config: YAML → frozen dataclasses, with every error naming the field and the fix.

Precedence, lowest first: dataclass defaults, the profile, the config file, ``--set`` overrides.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from deploy_opt.config.data import DataConfig
from deploy_opt.config.hf import with_hf_defaults
from deploy_opt.config.loader import build_dataclass, merge, parse_override
from deploy_opt.config.model import ModelConfig
from deploy_opt.config.prune import PruneConfig
from deploy_opt.config.qat import QATConfig
from dopt_common.errors import ConfigError
from dopt_common.executor import check_address
from dopt_common.names import check_run_name

log = logging.getLogger(__name__)

Activation = Literal["symmetric", "asymmetric"]
Target = Literal["ort-cpu", "ort-cuda", "tensorrt"]


@dataclass(frozen=True)
class ExportConfig:
    """torch → ONNX settings and the parity check."""

    exporter: Literal["dynamo", "torchscript"] = "dynamo"
    opset: int | None = None
    simplify: bool = True
    parity_atol: float = 1e-4
    parity_rtol: float = 1e-3
    parity_batches: int = 4
    external_data_mb: int = 1024

    def __post_init__(self) -> None:
        if self.opset is not None and self.opset < 17:
            raise ConfigError(f"export.opset is {self.opset}; deploy_opt needs opset 17 or newer")

    @property
    def resolved_opset(self) -> int:
        """The opset to export: dynamo needs 18+, TorchScript defaults to 17."""
        return self.opset or (18 if self.exporter == "dynamo" else 17)


Method = Literal["auto", "minmax", "percentile", "entropy", "mse"]


@dataclass(frozen=True)
class MethodOverride:
    """Use another range method for the tensors whose name matches a glob pattern."""

    pattern: str
    method: Method


@dataclass(frozen=True)
class CalibrationConfig:
    """How calibration samples are chosen and how activation ranges are computed."""

    # auto: per tensor, min/max, entropy or mse, whichever range carries the least quantization noise to the
    # model's output (graph inputs take min/max); see deploy_opt/analysis/sensitivity/range_noise.py.
    method: Method = "auto"
    samples: int = 512
    stratify: str = "auto"
    mode: Literal["balanced", "proportional"] = "balanced"
    min_per_stratum: int = 1
    seed: int = 0
    percentile: float = 99.99
    bins: int = 2048
    # A clipping method (entropy, percentile, mse) gives way to min/max on graph inputs and wherever it would clip
    # 1% or more of a tensor's values (few distinct levels); each decision is logged and recorded in build.json.
    guards: bool = True
    weights: Literal["absmax", "mse"] = "absmax"
    overrides: tuple[MethodOverride, ...] = ()

    def __post_init__(self) -> None:
        if self.samples <= 0:
            raise ConfigError(f"calibration.samples must be positive, got {self.samples}")
        if not 0 < self.percentile <= 100:
            raise ConfigError(f"calibration.percentile must be in (0, 100], got {self.percentile}")
        if self.bins < 256:
            raise ConfigError(f"calibration.bins must be at least 256 (entropy needs 128 levels), got {self.bins}")
        if self.min_per_stratum < 0:
            raise ConfigError(f"calibration.min_per_stratum must be >= 0, got {self.min_per_stratum}")
        if self.stratify not in ("auto", "label", "none") and ":" not in self.stratify:
            raise ConfigError(
                f"calibration.stratify '{self.stratify}' is unknown; use auto, label, none or 'module:function'"
            )

    def method_for(self, tensor: str) -> str:
        """The range method of one tensor: the first matching override, else ``method``."""
        return next((o.method for o in self.overrides if fnmatch.fnmatchcase(tensor, o.pattern)), self.method)


@dataclass(frozen=True)
class QuantizationConfig:
    """What is quantized, with which activation scheme, and what stays in high precision."""

    # auto: search placement, scheme, SmoothQuant, fallback and latency for the fastest INT8 model that meets
    # the gate (see the ``auto`` section); manual: quantize exactly as the settings below say.
    mode: Literal["auto", "manual"] = "auto"
    activations: Activation = "asymmetric"
    op_types: tuple[str, ...] = ("Conv", "ConvTranspose", "Gemm", "MatMul")
    exclude_nodes: tuple[str, ...] = ()
    # none | auto | a list of node names or glob patterns kept in high precision
    fallback: str | tuple[str, ...] = "none"
    fallback_by: Literal["node", "op_type"] = "node"
    # Conservative default: the classifier / LM head stays in high precision unless you opt in.
    keep_head: bool = True
    # Also quantize the outputs of the quantized ops (ORT's default: Conv/Gemm chains fuse into integer kernels).
    # Off, a tensor is quantized only as the input of a quantized node: what transformers with outlier-heavy
    # residual streams need, and what makes a fallback node's inputs really float.
    quantize_outputs: bool = True
    # SmoothQuant: move activation outlier channels into the following MatMul/Gemm weights before calibration.
    smoothing: Literal["none", "smoothquant"] = "none"
    # Weight levels: full (±127) or reduced (±63, ORT's reduce_range). auto: reduced when the build targets ORT
    # CPU and this machine's ORT int8 kernels saturate u8×s8 pair sums (x86 without VNNI), else full.
    weight_range: Literal["auto", "full", "reduced"] = "auto"
    smoothing_alpha: float = 0.5
    # Quantization-aware fine-tuning with distillation when PTQ is not enough (deploy_opt/qat/).
    qat: QATConfig = field(default_factory=QATConfig)

    def __post_init__(self) -> None:
        if not 0.0 <= self.smoothing_alpha <= 1.0:
            raise ConfigError(f"quantization.smoothing_alpha must be in [0, 1], got {self.smoothing_alpha}")
        if isinstance(self.fallback, str) and self.fallback not in ("none", "auto"):
            raise ConfigError(
                f"quantization.fallback '{self.fallback}' is unknown; use none, auto or a list of node patterns"
            )


# auto.recovery's methods, in the order the search tries them (autotune/recover.py)
RECOVERY_METHODS = ("cle", "bias", "adaround")


@dataclass(frozen=True)
class AutoConfig:
    """The auto search (``quantization.mode: auto``): its time budget and when INT8 is worth shipping."""

    budget_s: float = 240.0  # the search's, shared with an automatic QAT after it (quantization.qat.enabled: auto)
    # INT8 ships only where it is at least this much faster than FP32 on this machine (ModelOpt's autotune uses
    # 1.02); null: never judge by latency (CI runners, where speed is noise).
    min_gain: float | None = 1.02
    # The SmoothQuant trial's alpha (tried when no placement meets max_drop); null: no SmoothQuant trial.
    smoothquant_alpha: float | None = 0.5
    # budget_s counts work (this process's CPU seconds per benchmark thread), so load does not change which trials
    # start; wall time is capped at wall_cap x budget_s, and the verdict says when that cap ended the search.
    wall_cap: float = 5.0
    # Accuracy recovery trials when no placement meets max_drop (autotune/recover.py): any of "cle" (cross-layer
    # equalization), "bias" (empirical bias correction), "adaround" (learned rounding), in that order; []: none.
    recovery: tuple[str, ...] = RECOVERY_METHODS
    # ORT's dynamic INT8 (MatMul/Gemm/LSTM/Attention, activations quantized at run time) as a candidate when no
    # static one meets max_drop: for ORT CPU targets only, never with TensorRT among them
    dynamic: bool = True

    def __post_init__(self) -> None:
        if self.budget_s <= 0:
            raise ConfigError(f"auto.budget_s must be positive, got {self.budget_s}")
        unknown = [m for m in self.recovery if m not in RECOVERY_METHODS]
        if unknown:
            allowed = ", ".join(RECOVERY_METHODS)
            raise ConfigError(f"auto.recovery: unknown method {unknown[0]!r}; allowed: {allowed}")
        if self.wall_cap < 1:
            raise ConfigError(f"auto.wall_cap must be at least 1 (a multiple of auto.budget_s), got {self.wall_cap}")
        if self.min_gain is not None and self.min_gain <= 0:
            raise ConfigError(f"auto.min_gain must be positive or null, got {self.min_gain}")
        if self.smoothquant_alpha is not None and not 0.0 <= self.smoothquant_alpha <= 1.0:
            raise ConfigError(f"auto.smoothquant_alpha must be in [0, 1], got {self.smoothquant_alpha}")


@dataclass(frozen=True)
class SensitivityConfig:
    """Per-node sensitivity analysis (also run by fallback: auto)."""

    enabled: bool = False
    mode: Literal["exhaustive", "proxy", "proxy+topk"] = "proxy+topk"
    top_k: int = 8
    subset: float = 0.1
    # Where the per-node evaluations run: 1 in-process; > 1 or an address as Ray tasks (one CPU, gpus_per_task
    # GPUs each); the models and the subset go to Ray's object store once. The flags --parallel, --address and
    # --gpus-per-trial set these.
    parallel: int = 1
    address: str | None = None
    gpus_per_task: float = 0.0

    def __post_init__(self) -> None:
        if self.parallel < 1 or self.gpus_per_task < 0:
            raise ConfigError(
                f"sensitivity.parallel must be >= 1 and gpus_per_task >= 0, got {self.parallel}, {self.gpus_per_task}"
            )
        if not 0 < self.subset <= 1:
            raise ConfigError(f"sensitivity.subset must be in (0, 1], got {self.subset}")
        if self.top_k < 1:
            raise ConfigError(f"sensitivity.top_k must be at least 1, got {self.top_k}")
        check_address(self.address, "sensitivity.address (--address)")


@dataclass(frozen=True)
class DeployConfig:
    """Which backends the build targets and what precision unquantized nodes keep."""

    targets: tuple[Target, ...] = ("ort-cpu",)
    fallback_precision: Literal["fp32", "fp16"] = "fp32"


@dataclass(frozen=True)
class BenchmarkConfig:
    """Latency measurement settings."""

    enabled: bool = True
    threads: int = 2
    batch_sizes: tuple[int, ...] = (1, 32)
    warmup: int = 10
    repeats: int = 50
    # Per batch size: a slow model stops repeating past this many seconds (after at least 5 rounds); null: never.
    max_seconds: float | None = 20.0

    def __post_init__(self) -> None:
        if self.threads <= 0 or self.warmup < 0 or self.repeats <= 0:
            raise ConfigError("benchmark: threads and repeats must be positive and warmup non-negative")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError(f"benchmark.max_seconds must be positive or null, got {self.max_seconds}")
        if not self.batch_sizes or any(b <= 0 for b in self.batch_sizes):
            raise ConfigError(f"benchmark.batch_sizes must be positive integers, got {list(self.batch_sizes)}")


@dataclass(frozen=True)
class RuntimeConfig:
    """How the build's own work runs: calibration, smoothing, the auto search, evaluation and the comparison (the
    benchmark's timing runs at ``benchmark.threads``)."""

    # ORT (and torch) intra-op threads of every stage but the benchmark; null: benchmark.threads, which drove them
    # all before this section existed, so a config that sets only benchmark.threads builds as it always did.
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads <= 0:
            raise ConfigError(f"runtime.threads must be positive or null, got {self.threads}")


@dataclass(frozen=True)
class GateConfig:
    """Release criteria: the largest metric drop and the smallest speedup allowed."""

    max_drop: float = 1.0
    min_speedup: float | None = 1.0
    speedup_batch: int | None = None
    # A "model.int8.onnx" with no quantized node is the FP32 model: it fails the gate unless this is true.
    allow_fp32: bool = False

    def __post_init__(self) -> None:
        if not self.max_drop >= 0:  # a negative tolerance fails every build, and would replace a passing one
            raise ConfigError(f"gate.max_drop must be >= 0 (metric points), got {self.max_drop}; fix: e.g. 1.0")
        if self.min_speedup is not None and not self.min_speedup >= 0:  # 0: any measured speed passes
            raise ConfigError(f"gate.min_speedup must be >= 0 or null, got {self.min_speedup}; fix: e.g. 1.0")
        if self.speedup_batch is not None and self.speedup_batch < 1:
            raise ConfigError(f"gate.speedup_batch must be >= 1 or null, got {self.speedup_batch}")


@dataclass(frozen=True)
class CompareConfig:
    """Cross-backend comparison on fixed samples (compare.json): how many, and what each backend must meet."""

    enabled: bool = True
    samples: int = 32
    seed: int | None = None  # None: the build's seed
    batch_size: int = 8
    # FP32 backends (torch, ORT) against the reference: only float rounding may differ.
    fp32_min_sqnr_db: float = 60.0
    fp32_min_cosine: float = 0.9999
    # INT8 backends: quantization noise is expected; these catch a broken artifact, not a small accuracy loss.
    int8_min_sqnr_db: float = 10.0
    int8_min_cosine: float = 0.95
    min_top1_agreement: float = 0.8
    # Per layer: a tensor's own Q/DQ SQNR below this, or a node SQNR drop beyond this, is the first divergence
    # (healthy: >= 18.7 dB and <= 2.3 dB on MiniLM, >= 39.7 dB and <= 0.5 dB on the digits demo).
    min_quant_sqnr_db: float = 10.0
    max_drop_db: float = 20.0

    def __post_init__(self) -> None:
        if self.samples <= 0 or self.batch_size <= 0:
            raise ConfigError(
                f"compare.samples and compare.batch_size must be positive, got {self.samples}, {self.batch_size}"
            )
        for key in ("fp32_min_cosine", "int8_min_cosine", "min_top1_agreement"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"compare.{key} must be in [0, 1], got {getattr(self, key)}")
        for key in ("fp32_min_sqnr_db", "int8_min_sqnr_db", "min_quant_sqnr_db", "max_drop_db"):
            if not 0.0 <= getattr(self, key) <= 200.0:
                raise ConfigError(f"compare.{key} must be in [0, 200] dB, got {getattr(self, key)}")


MAX_DESCRIPTION = 4000  # characters


@dataclass(frozen=True)
class BuildConfig:
    """A whole build, as resolved from defaults, profile, file and overrides."""

    name: str
    model: ModelConfig
    data: DataConfig
    description: str = ""
    profile: str = "cpu-server"
    seed: int = 0
    export: ExportConfig = field(default_factory=ExportConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    quantization: QuantizationConfig = field(default_factory=QuantizationConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    sensitivity: SensitivityConfig = field(default_factory=SensitivityConfig)
    deploy: DeployConfig = field(default_factory=DeployConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    # As written: threads null means benchmark.threads; stages take ``stage_runtime``, where that is resolved.
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    # Structured pruning and distillation of a torch model before export (deploy_opt/prune/); off by default.
    prune: PruneConfig = field(default_factory=PruneConfig)
    # Set by the loader (the config file's folder), never by the user.
    base_dir: str = field(default=".", metadata={"internal": True})

    def __post_init__(self) -> None:
        check_run_name(self.name)  # it names reports/<name>/
        if len(self.description) > MAX_DESCRIPTION:  # it is copied into build.json, summary.md and report.html
            raise ConfigError(
                f"description is {len(self.description)} characters long (at most {MAX_DESCRIPTION}); fix: shorten "
                "it, and link to longer notes"
            )

        if self.prune.enabled and not self.model.factory:
            raise ConfigError(
                "prune needs model.factory: structured pruning works on a torch model before export, not on an "
                "ONNX file; fix: give the torch factory, or set prune.ratio: 0"
            )

    @property
    def stage_runtime(self) -> RuntimeConfig:
        """``runtime`` with its threads resolved (null: ``benchmark.threads``): what the stages run with."""
        threads = self.benchmark.threads if self.runtime.threads is None else self.runtime.threads
        return RuntimeConfig(threads=threads)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data, for build.json."""
        return dataclasses.asdict(self)


def resolve_config(raw: dict[str, Any], profile: dict[str, Any], overrides: list[str], base_dir: str) -> BuildConfig:
    """Merge profile ← file ← overrides and build the frozen config."""
    data = merge(profile, raw)
    for text in overrides:
        data = merge(data, parse_override(text))
    config = dataclasses.replace(build_dataclass(BuildConfig, data, ""), base_dir=base_dir)
    if config.model.hf is not None:
        filled = with_hf_defaults(config.model, config.data, base_dir)  # reads the folder's config.json
        config = dataclasses.replace(config, model=filled.model, data=filled.data)
    return _time_speedup_batch(_force_tensorrt_symmetric(config))


def _time_speedup_batch(config: BuildConfig) -> BuildConfig:
    """The gate judges speed at ``gate.speedup_batch``, so the benchmark times that batch too."""
    batch, sizes = config.gate.speedup_batch, config.benchmark.batch_sizes
    if batch is None or batch in sizes:
        return config
    log.info("benchmark: timing batch %d too (gate.speedup_batch); batch sizes %s", batch, sorted({*sizes, batch}))
    bench = dataclasses.replace(config.benchmark, batch_sizes=tuple(sorted({*sizes, batch})))
    return dataclasses.replace(config, benchmark=bench)


def _force_tensorrt_symmetric(config: BuildConfig) -> BuildConfig:
    """TensorRT accepts only zero-point-0 Q/DQ, so a build that targets it must be symmetric."""
    if "tensorrt" in config.deploy.targets and config.quantization.activations != "symmetric":
        log.warning(
            "deploy.targets includes tensorrt, which accepts only symmetric int8: using symmetric activations "
            "instead of %s",
            config.quantization.activations,
        )
        quant = dataclasses.replace(config.quantization, activations="symmetric")
        return dataclasses.replace(config, quantization=quant)
    return config
