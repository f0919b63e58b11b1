"""quantize_report.json as a typed record: what ``quantize-llm`` prints and what ``gate`` judges.

``LLMReport.from_json`` is the one place that knows where the perplexity, stability, KV-cache and serve sections
sit (format ``REPORT_FORMAT``); a report without a format is read as this one (a hand-written report for the
gate), another format is one ReportError naming both. Sections only the page and people read (model,
calibration, quantization, timings, config, versions) travel as written in ``sections``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dopt_common.errors import ReportError

REPORT_FORMAT = "deploy_opt.llm_quantize/1"
TYPED = ("format", "name", "method", "perplexity", "stability", "kv_cache", "scheme", "checkpoint", "serve", "gate")


@dataclass(frozen=True)
class PerplexityChange:
    """Held-out perplexity before and after quantization (each: ppl, nll, tokens, windows, ...)."""

    original: Mapping[str, Any]
    quantized: Mapping[str, Any]
    text: Any = None  # what it was measured on

    @property
    def before(self) -> float:
        """The original model's perplexity."""
        return float(self.original["ppl"])

    @property
    def after(self) -> float:
        """The quantized model's perplexity."""
        return float(self.quantized["ppl"])

    @property
    def increase(self) -> float:
        """The relative increase, quantized over original, minus 1 (inf when the quantized one is not finite)."""
        return self.after / self.before - 1 if math.isfinite(self.after) else math.inf

    def to_json(self) -> dict[str, Any]:
        """The report's ``perplexity`` section."""
        data = {"original": dict(self.original), "quantized": dict(self.quantized), "increase": self.increase}
        return data if self.text is None else data | {"text": self.text}


@dataclass(frozen=True)
class LLMReport:
    """One quantize-llm run: its perplexity change, stability runs, KV-cache checks, scheme and serving."""

    name: str
    perplexity: PerplexityChange
    stability: Mapping[str, Any] | None = None  # ok, flagged, generations, excused, runs
    kv_cache: Mapping[str, Any] | None = None  # kv_cache, perplexity, stability, memory
    method: str | None = None
    scheme: Mapping[str, Any] | None = None  # the resolved scheme and the reason for it
    checkpoint: Mapping[str, Any] | None = None  # folder, format, reload
    serve: Mapping[str, Any] | None = None  # servable, command or reason
    gate: Mapping[str, Any] | None = None  # the verdict the run applied
    sections: Mapping[str, Any] = field(default_factory=dict)  # the rest, as written
    format: str = REPORT_FORMAT

    @property
    def stable(self) -> bool | None:
        """Whether the stability run flagged nothing (None when it did not run)."""
        return None if not self.stability or "ok" not in self.stability else bool(self.stability["ok"])

    def to_json(self) -> dict[str, Any]:
        """quantize_report.json as written."""
        data: dict[str, Any] = {"format": self.format, "name": self.name, "method": self.method}
        data |= {"scheme": self.scheme, "checkpoint": self.checkpoint, "perplexity": self.perplexity.to_json()}
        data |= {"stability": self.stability, "kv_cache": self.kv_cache}
        data |= dict(self.sections)
        data |= {key: getattr(self, key) for key in ("serve", "gate") if getattr(self, key) is not None}
        return {k: v for k, v in data.items() if v is not None or k in ("kv_cache", "stability")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LLMReport:
        """Read quantize_report.json; missing perplexities or another format are a ReportError naming them."""
        found = data.get("format", REPORT_FORMAT)
        if found != REPORT_FORMAT:
            raise ReportError(f"quantize_report.json has format {found!r}; this deploy_opt reads {REPORT_FORMAT!r}")
        ppl = data.get("perplexity")
        try:
            change = PerplexityChange(ppl["original"], ppl["quantized"], ppl.get("text"))
            change.before, change.after  # noqa: B018 (both must read as numbers)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReportError("quantize_report: perplexity.original/quantized.ppl missing; rerun quantize-llm") from exc
        return cls(
            name=str(data.get("name", "quantize-llm")),
            perplexity=change,
            stability=data.get("stability"),
            kv_cache=data.get("kv_cache"),
            method=data.get("method"),
            scheme=data.get("scheme"),
            checkpoint=data.get("checkpoint"),
            serve=data.get("serve"),
            gate=data.get("gate"),
            sections={k: v for k, v in data.items() if k not in TYPED},
            format=found,
        )
