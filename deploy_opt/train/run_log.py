"""The training log, ``train_log.jsonl``: one JSON object per line, each with an ``event``.

Events: ``start`` (or ``resume``) with the config, the parameter count and, when asked, the recommender's advice
and reasons; ``step`` per optimizer step (step, epoch, lr, loss, grad_norm, update_norm, optimizer_state_bytes,
step_time_s, skipped, skip_reason when skipped, batch_size); ``eval`` with the final evaluation metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dopt_common.files import atomic_path


def write_event(log_file: Any, record: dict[str, Any]) -> None:
    """Append one record and flush (a crash loses at most the line being written)."""
    # allow_nan: a NaN loss or an infinite grad norm is exactly what the log must show; Python's JSON writes NaN.
    log_file.write(json.dumps(record, allow_nan=True) + "\n")
    log_file.flush()


def truncate_log(path: Path, step: int) -> None:
    """Drop the log lines written after the checkpoint the run resumes from (they will be written again)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines() if _keep_on_resume(line, step)]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def _keep_on_resume(line: str, step: int) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False  # a line cut short by the crash
    if record.get("event") == "eval":
        return False
    return record.get("event") != "step" or record.get("step", 0) <= step


def read_train_log(path: str | Path, event: str = "step") -> list[dict[str, Any]]:
    """The records of one event kind from a ``train_log.jsonl``."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [r for r in (json.loads(line) for line in lines if line.strip()) if r.get("event") == event]
