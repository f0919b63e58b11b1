"""The stability run judged against the FP model: the same prompts, seeds and modes on both, and a quantized
generation flagged only for degeneration the FP model does not show at the same generation.

NaN or Inf logits and failed generations are always flagged: the FP model producing them excuses nothing. Repetition
(``repeated_ngrams``, ``dominant_token``) that the FP model also shows on that prompt is the model's own habit, not
quantization's, and is reported as ``excused``.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

ALWAYS_FLAGGED = ("non_finite_logits", "generation_error")


def judge_against_baseline(baseline: dict[str, Any], quantized: dict[str, Any]) -> dict[str, Any]:
    """The quantized stability record with each run's FP generation beside it and only the new flags counted."""
    if len(baseline["runs"]) != len(quantized["runs"]):
        raise ValueError("the FP and quantized stability runs differ in length")  # both come from one config
    runs = []
    for fp, q in zip(baseline["runs"], quantized["runs"], strict=True):
        new = [f for f in q["flags"] if f in ALWAYS_FLAGGED or f not in fp["flags"]]
        excused = [f for f in q["flags"] if f not in new]
        runs.append(
            {
                **q,
                "new_flags": new,
                "excused_flags": excused,
                "fp_text": fp["text"],
                "fp_flags": fp["flags"],
                "fp_repeated_4gram_share": fp["repeated_4gram_share"],
                "fp_top_token_share": fp["top_token_share"],
            }
        )
        if new:
            log.warning(
                "stability run %d (%s): %s, which the FP model's generation does not show",
                len(runs) - 1,
                q["mode"],
                ", ".join(new),
            )
        if excused:
            log.info(
                "stability run %d: %s also in the FP model's generation, not counted", len(runs) - 1, ", ".join(excused)
            )
    flagged = sum(bool(r["new_flags"]) for r in runs)
    return {
        **{k: v for k, v in quantized.items() if k != "runs"},
        "ok": flagged == 0,
        "flagged": flagged,
        "flagged_raw": quantized["flagged"],
        "excused": sum(bool(r["excused_flags"]) and not r["new_flags"] for r in runs),
        "baseline": {"flagged": baseline["flagged"], "ok": baseline["ok"], "warnings": baseline["warnings"]},
        "judged_against": "the FP model's generations (same prompts, seeds and modes)",
        "runs": runs,
    }
