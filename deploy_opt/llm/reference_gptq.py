"""A reference GPTQ beside deploy_opt's own (``checks.reference_gptq``, ``--reference-gptq``; off by default).

llm-compressor's ``GPTQModifier`` quantizes the same float model, on the same calibration token windows, the same
Linears (deploy_opt's targets: ``keep`` left out), the run's group size and the run's symmetry (the default's
AWQ-layout codes carry zero points, so its reference is asymmetric: llm-compressor's W4A16_ASYM; a symmetric run's
is W4A16), W4A16 integer weights, act-order ``static`` (columns visited by decreasing Hessian diagonal, groups kept
as stored), dampening 0.01, blocks of 128. Symmetry matters more than the algorithm at 4 bits: on SmolLM2-135M at
group 64 symmetric GPTQ loses +41.7% perplexity and asymmetric +12.9% (README), so comparing an asymmetric run with
a symmetric reference would flatter it. It runs in a Python that has it, often its own venv (it pins its own
transformers): ``checks.reference_python``, else this Python, else ``benchmarks/corpus/.cache/llmcompressor-venv``
(made by ``benchmarks/llm/reference_venv.sh``). Where none has it, the run goes on and the report says so in one line.

The float model goes to the worker (``reference_worker.py``) as a Hugging Face folder (the source folder, or the
loaded model saved to a temporary one before deploy_opt quantizes it), the token ids as JSON. The worker scores
the same evaluation windows as ``checks.perplexity`` before and after, and returns per window
``[summed NLL, scored tokens]``: the report quotes the reference's increase with the same paired bootstrap
interval as deploy_opt's (``perplexity_increase_interval``), side by side.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy_opt.llm.config import LLMConfig
from dopt_common.files import scratch_dir

log = logging.getLogger(__name__)

TOOL = "llm-compressor"
PINS = ("llmcompressor==0.14.0.1", "torch==2.13.0")
WORKER = Path(__file__).with_name("reference_worker.py")
VENV_PYTHON = Path(__file__).resolve().parents[2] / "benchmarks/corpus/.cache/llmcompressor-venv/bin/python"
INSTALL = (
    "bash benchmarks/llm/reference_venv.sh (a venv with "
    + " ".join(PINS)
    + "), or --reference-python PATH naming a Python that has llmcompressor"
)
FP_GAP_WARN = 1e-3  # the two float scorings of the same windows should agree far closer than this


@dataclass(frozen=True)
class ReferenceSettings:
    """What the reference runs: llm-compressor's GPTQModifier on integer weights in groups (W4A16)."""

    group_size: int
    targets: tuple[str, ...]
    bits: int = 4
    symmetric: bool = True
    actorder: str = "static"  # llm-compressor's name for act-order with the stored groups ("weight")
    dampening_frac: float = 0.01
    block_size: int = 128

    def to_worker(self) -> dict[str, Any]:
        """The settings as the worker reads them."""
        return asdict(self)

    def describe(self) -> str:
        """One line for the report: what ran."""
        return (
            f"GPTQModifier W{self.bits}A16, int{self.bits} group {self.group_size}, "
            f"{'symmetric' if self.symmetric else 'asymmetric'}, actorder {self.actorder}, dampening_frac "
            f"{self.dampening_frac}, block_size {self.block_size}, {len(self.targets)} Linears (deploy_opt's targets)"
        )


def find_reference_python(configured: str | None) -> tuple[str | None, str]:
    """(a Python that imports llmcompressor, where it was found), or (None, why not, in one line)."""
    candidates = [configured] if configured else [sys.executable, str(VENV_PYTHON)]
    for python in candidates:
        if not Path(python).is_file():
            continue
        probe = subprocess.run([python, "-c", "import llmcompressor"], capture_output=True, text=True)
        if probe.returncode == 0:
            return python, python
    where = configured or f"this Python or {VENV_PYTHON}"
    return None, f"{TOOL} is not installed in {where}; fix: {INSTALL}"


def not_run(reason: str) -> dict[str, Any]:
    """The report's reference section when it did not run (logged once, as a warning)."""
    log.warning("reference GPTQ not run: %s", reason)
    return {"ran": False, "tool": TOOL, "reason": reason}


def reference_before_quantization(config: LLMConfig, loaded: Any, window: Any, times: Any) -> dict[str, Any] | None:
    """With ``checks.reference_gptq``, the reference's result (timed as stage ``reference_gptq``); else None.
    Called while the model is still the float one."""
    if not config.checks.reference_gptq:
        return None
    with times.stage("reference_gptq"):
        return run_reference_gptq(config, loaded, window)


def reference_section(config: LLMConfig, loaded: Any, measured: Any) -> dict[str, Any] | None:
    """The report's ``reference_gptq`` section (None when not asked for)."""
    if not config.checks.reference_gptq:
        return None
    raw = measured.reference
    if raw is None:  # the layer-wise walk never calls the reference
        raw = not_run("model.onload layers: the reference loads the whole model, which this run avoids")
    return reference_record(raw, measured.original, measured.quantized, loaded.scheme.method)


def run_reference_gptq(config: LLMConfig, loaded: Any, window: Any) -> dict[str, Any]:
    """Run the reference on ``loaded``'s float model (before deploy_opt quantizes it): the worker's result, or a
    not-run record (tool missing, a scheme it cannot run, the worker failing) that never fails the run."""
    scheme = loaded.scheme
    if scheme.method.startswith("torchao") or scheme.group_size < 1:
        return not_run(f"method {scheme.method}, group {scheme.group_size}: the reference runs grouped GPTQ only")
    python, where = find_reference_python(config.checks.reference_python)
    if python is None:
        return not_run(where)
    settings = reference_settings(loaded, config.quantization.keep)
    with scratch_dir("deploy_opt-reference-") as scratch:
        folder = Path(scratch)
        request = {
            "model": str(model_folder(loaded, folder)),
            "calibration": [list(ids) for ids in loaded.selection.input_ids],
            "evaluation": evaluation_windows(loaded.tokenizer, loaded.evaluation_docs, window),
            "settings": settings.to_worker(),
        }
        (folder / "request.json").write_text(json.dumps(request), encoding="utf-8")
        result = _run_worker(python, folder)
    if result.get("ran") is False:
        return result
    return {"ran": True, "tool": TOOL, "python": python, "settings": settings.describe(), **result}


def reference_settings(loaded: Any, keep: tuple[str, ...]) -> ReferenceSettings:
    """The run's group size and quantized Linears (``keep`` left out), in the reference's terms."""
    from deploy_opt.llm.quantize_engine import target_linears

    targets = tuple(sorted(target_linears(loaded.model, keep)))
    return ReferenceSettings(group_size=loaded.scheme.group_size, targets=targets, symmetric=loaded.scheme.symmetric)


def model_folder(loaded: Any, scratch: Path) -> Path:
    """A Hugging Face folder of the float model: the source folder itself, or the loaded model saved there."""
    source = Path(loaded.source)
    if source.is_dir() and (source / "config.json").is_file():
        return source
    folder = scratch / "model"
    loaded.model.save_pretrained(folder)  # a GGUF source: the float model deploy_opt dequantized and measured
    loaded.tokenizer.save_pretrained(folder)
    return folder


def evaluation_windows(tokenizer: Any, docs: Any, window: Any) -> list[dict[str, Any]]:
    """The windows ``checks.perplexity`` scores: each one's token ids and how many of its last tokens count."""
    from deploy_opt.llm.checks import plan_windows

    plan = plan_windows(tokenizer, docs, window)
    return [{"ids": plan.window(number), "fresh": fresh} for number, (_, _, fresh) in enumerate(plan.spans)]


def _run_worker(python: str, folder: Path) -> dict[str, Any]:
    """The worker's result.json, or a not-run record naming its exit code and last line."""
    log_path = folder / "worker.log"
    start = time.perf_counter()
    log.info("reference GPTQ: %s %s (log: %s)", python, WORKER.name, log_path)
    with log_path.open("w", encoding="utf-8") as out:
        run = subprocess.run([python, str(WORKER), str(folder)], stdout=out, stderr=subprocess.STDOUT)
    result_path = folder / "result.json"
    if run.returncode != 0 or not result_path.is_file():
        lines = [line for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
        return not_run(f"{TOOL} failed (exit {run.returncode}): {(lines or ['no output'])[-1][:200]}")
    result = json.loads(result_path.read_text(encoding="utf-8"))
    before, after = (_ppl(result[key]) for key in ("original_window_nll", "quantized_window_nll"))
    log.info("reference GPTQ: perplexity %.3f -> %.3f (%+.2f%%)", before, after, 100 * (after / before - 1))
    return {**result, "wall_s": time.perf_counter() - start}


def _ppl(windows: list[list[float]]) -> float:
    import math

    return math.exp(sum(n for n, _ in windows) / sum(t for _, t in windows))


def reference_record(
    raw: Mapping[str, Any], original: Mapping[str, Any], quantized: Mapping[str, Any], method: str
) -> dict[str, Any]:
    """The report's ``reference_gptq`` section: both increases with their intervals, side by side."""
    if not raw.get("ran"):
        return dict(raw)
    ref_fp, ref_q = raw["original_window_nll"], raw["quantized_window_nll"]
    reference = _side(ref_fp, ref_q)
    ours = _side(original.get("window_nll"), quantized.get("window_nll"))
    ours = ours or {"ppl_original": original["ppl"], "ppl_quantized": quantized["ppl"]}
    ours["increase"] = float(quantized["ppl"]) / float(original["ppl"]) - 1
    fp_gap = reference["ppl_original"] / float(original["ppl"]) - 1
    if abs(fp_gap) > FP_GAP_WARN:
        log.warning("reference GPTQ: its float perplexity differs from deploy_opt's by %+.3f%%", 100 * fp_gap)
    keep = ("tool", "python", "settings", "versions", "quantize_s", "wall_s", "threads")
    return {
        "ran": True,
        **{key: raw[key] for key in keep if key in raw},
        "windows": len(ref_q),
        "tokens": int(sum(tokens for _, tokens in ref_q)),
        "float_ppl_gap": fp_gap,
        "reference": reference | {"window_nll": ref_q, "original_window_nll": ref_fp},
        "deploy_opt": ours | {"method": method},
        "difference": ours["increase"] - reference["increase"],
        "quantized_vs_reference": _paired(ref_q, quantized.get("window_nll")),
    }


def _paired(reference: Any, ours: Any) -> dict[str, Any] | None:
    """Our quantized perplexity over the reference's, minus 1, with its paired 95% interval over the windows
    (below 0: ours is the better quantization of the two); None without our per-window scores."""
    from deploy_opt.evaluation.uncertainty import perplexity_increase_interval

    if not ours or len(ours) != len(reference) or len(ours) < 2:
        return None
    interval = perplexity_increase_interval(reference, ours)
    return {"value": interval.value, "ci95": [interval.low, interval.high]}


def _side(fp: Any, q: Any) -> dict[str, Any] | None:
    """Perplexity before and after and the increase with its paired 95% interval, from per-window scores."""
    from deploy_opt.evaluation.uncertainty import perplexity_increase_interval

    if not fp or not q or len(fp) != len(q):
        return None
    side = {"ppl_original": _ppl(fp), "ppl_quantized": _ppl(q)}
    if len(fp) < 2:
        return side | {"increase": side["ppl_quantized"] / side["ppl_original"] - 1}
    interval = perplexity_increase_interval(fp, q)
    return side | {"increase": interval.value, "ci95": [interval.low, interval.high]}


def reference_line(record: Mapping[str, Any]) -> str:
    """One line for the terminal and the page: both increases side by side, or why the reference did not run."""
    if not record.get("ran"):
        return f"reference GPTQ: not run: {record.get('reason')}"
    ours, ref = record["deploy_opt"], record["reference"]
    version = (record.get("versions") or {}).get("llmcompressor", "?")
    line = (
        f"reference GPTQ ({record['tool']} {version}): {_increase(ref)} vs deploy_opt {ours['method']} "
        f"{_increase(ours)} on the same {record['windows']} windows"
    )
    paired = record.get("quantized_vs_reference")
    if paired:
        low, high = paired["ci95"]
        line += f"; ours/reference perplexity {paired['value']:+.2%} (95% CI {low:+.2%} to {high:+.2%})"
    return line


def _increase(side: Mapping[str, Any]) -> str:
    ci = side.get("ci95")
    return f"{side['increase']:+.2%}" + (f" (95% CI {ci[0]:+.2%} to {ci[1]:+.2%})" if ci else "")
