"""benchmarks/device_check.sh --dry-run: the GPU machine's script runs its real code paths on the CPU, and its
table and JSON carry every row (the optimizers, GPTQ and AWQ, and their perplexity with the KV cache simulated)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "device_check.sh"

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


pytestmark = pytest.mark.slow  # every test reads one dry run of the whole device check (a subprocess)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    if shutil.which("timeout") is None:
        pytest.skip("needs coreutils' timeout")
    out = tmp_path_factory.mktemp("device_check")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "DEPLOY_OPT_CACHE": str(out / "cache")}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=240, cwd=REPO
    )
    return done, out


def test_dry_run_exits_zero(dry_run):
    done, _ = dry_run
    assert done.returncode == 0, done.stderr[-3000:]


def test_json_has_every_section_and_row(dry_run):
    _, out = dry_run
    summary = json.loads((out / "device_check.json").read_text(encoding="utf-8"))
    assert summary["dry_run"] is True
    assert summary["failed"] == []
    assert set(summary["sections"]) == {"env", "optimizers", "llm", "tensorrt"}
    [trt] = [row for row in summary["rows"] if row["check"] == "tensorrt"]
    assert trt["result"].startswith("not built")  # no tensorrt in this image, or --dry-run
    subjects = {(row["check"], row["subject"]) for row in summary["rows"]}
    assert {
        ("optimizers", "torch AdamW fused"),
        ("optimizers", "Int8AdamW"),
        ("optimizers", "Int8AdamW eager"),
    } <= subjects
    assert {row["subject"].split()[0] for row in summary["rows"] if row["check"] == "llm"} == {
        "gptq",
        "awq",
        "awq-gptq",
    }
    assert {row["subject"] for row in summary["rows"] if row["check"] == "kv-cache"} == {
        f"{row['subject'].split()[0]} {row['subject'].split()[1]} + KV int8/int4"
        for row in summary["rows"]
        if row["check"] == "llm"
    }


def test_optimizer_numbers_are_sane(dry_run):
    _, out = dry_run
    section = json.loads((out / "optimizers.json").read_text(encoding="utf-8"))
    rows = {row["optimizer"]: row for row in section["rows"]}
    # fp32 AdamW keeps two fp32 moments (8 B/param); the int8 state must be well under half of that.
    assert rows["torch AdamW fused"]["bytes_per_param"] == pytest.approx(8.0, abs=0.01)
    assert rows["Int8AdamW"]["bytes_per_param"] < 4.0
    for row in rows.values():
        assert row["optimizer_ms"] > 0 and row["step_ms"] >= row["optimizer_ms"]
        assert row["eval_loss"] < section["initial_eval_loss"]  # every optimizer learned something


def test_llm_rows_quantized_every_linear(dry_run):
    _, out = dry_run
    section = json.loads((out / "llm.json").read_text(encoding="utf-8"))
    assert section["model"] == "trained"
    for row in section["rows"]:
        assert row["linears"] == 14  # 2 layers x (q, k, v, o, gate, up, down)
        assert row["ppl_w4"] > 1 and row["quantize_s"] > 0
        assert row["ppl_kv8"] > 1 and row["ppl_kv4"] > 1 and row["ppl_kv8"] != row["ppl_w4"]
        assert row["group_size"] == 128


def test_table_prints_every_row(dry_run):
    done, out = dry_run
    table = done.stdout
    assert table == (out / "table.txt").read_text(encoding="utf-8")
    for text in (
        "torch AdamW fused",
        "Int8AdamW eager",
        "gptq g128",
        "awq g128",
        "kv-cache",
        "+ KV int8/int4",
        "(int8)",
        "(int4)",
        "B/param",
        "perplexity",
    ):
        assert text in table, text
