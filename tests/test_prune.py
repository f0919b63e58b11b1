"""Structured pruning: shapes across residuals, whole heads, FFN neurons, pruned.pt, and a pruned build's gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_pruning")

import tiny_prune  # noqa: E402

from deploy_opt.config.prune import PruneConfig  # noqa: E402
from deploy_opt.prune.checkpoint import load_pruned, save_pruned  # noqa: E402
from deploy_opt.prune.structure import find_attention, prune_structure  # noqa: E402
from deploy_opt.report.build_record import BuildRecord  # noqa: E402
from deploy_opt.report.gate import GateResult, apply_gate  # noqa: E402
from deploy_opt.report.outcome import GateSettings  # noqa: E402
from dopt_common.errors import ConfigError, ModelError  # noqa: E402

HERE = Path(__file__).parent


def _judge(
    build: dict, max_drop: float | None, min_speedup: float | None, speedup_batch: int | None = None, **kw: bool
) -> GateResult:
    """``apply_gate`` on a build.json document, with the thresholds the gate command would pass."""
    thresholds = GateSettings(max_drop, min_speedup, speedup_batch, kw.get("allow_fp32", False))
    return apply_gate(BuildRecord.from_json(build), thresholds)


def _magnitude():
    import torch_pruning as tp

    return tp.importance.GroupMagnitudeImportance(p=2)


def _kept_rows(pruned: torch.Tensor, original: torch.Tensor) -> list[int]:
    """The original row each pruned row is (exactly) a copy of."""
    return [int(torch.nonzero((original == row).all(dim=1))[0]) for row in pruned]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_channel_pruning_keeps_residual_shapes_consistent() -> None:
    """Every conv feeding a residual add shrinks alike; the depthwise conv keeps groups == channels; ORT agrees."""
    import onnxruntime as ort

    model, original = tiny_prune.build_cnn(), tiny_prune.build_cnn()
    x = torch.randn(4, 1, 8, 8)
    cuts, _ = prune_structure(model, (x,), PruneConfig(ratio=0.5, per_layer="uniform", round_to=None), _magnitude())
    assert [c.kind for c in cuts] == ["channels"] and (cuts[0].before, cuts[0].after) == (16, 8)
    assert model.stem[0].out_channels == 8 and model.stem[1].num_features == 8
    for block in model.blocks:
        depthwise, pointwise = block[0], block[3]
        assert depthwise.in_channels == depthwise.out_channels == depthwise.groups == 8
        assert pointwise.in_channels == pointwise.out_channels == 8
    assert model.head.in_features == 8 and model.head.out_features == 5  # the output layer is never pruned
    assert model(x).shape == original(x).shape == (4, 5)
    import io

    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, input_names=["image"], dynamo=False)
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        np.testing.assert_allclose(session.run(None, {"image": x.numpy()})[0], model(x).numpy(), atol=1e-5)


def test_head_pruning_removes_whole_heads() -> None:
    """q, k and v keep the same whole heads; the pruned model is the original with the other heads masked."""
    model, original = tiny_prune.build_encoder(), tiny_prune.build_encoder()
    tokens = tiny_prune.tokens()
    config = PruneConfig(ratio=0.0, head_ratio=0.5, targets=("heads",), per_layer="uniform", round_to=None)
    assert len(find_attention(model)) == 2
    cuts, _ = prune_structure(model, (tokens,), config, _magnitude())
    assert {(c.kind, c.before, c.after) for c in cuts} == {("heads", 4, 2)}
    masked = tiny_prune.build_encoder()
    for layer, old, mask_layer in zip(model.layers, original.layers, masked.layers, strict=True):
        assert layer.attention.num_attention_heads == 2 and layer.attention.all_head_size == 16
        heads = []
        for name in ("query", "key", "value"):
            rows = _kept_rows(getattr(layer.attention, name).weight, getattr(old.attention, name).weight)
            blocks = [rows[i : i + 8] for i in range(0, len(rows), 8)]
            assert all(b == list(range(b[0], b[0] + 8)) and b[0] % 8 == 0 for b in blocks), "a head was split"
            heads.append([b[0] // 8 for b in blocks])
        assert heads[0] == heads[1] == heads[2]
        dropped = [h for h in range(4) if h not in heads[0]]
        with torch.no_grad():
            for h in dropped:
                mask_layer.attention_output.weight[:, h * 8 : (h + 1) * 8] = 0
        assert layer.intermediate.out_features == 64  # FFN untouched: only heads were targeted
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), masked(tokens), atol=1e-5, rtol=1e-5)


def test_ffn_pruning_is_the_original_with_neurons_removed() -> None:
    """Only the intermediate width shrinks (the residual width never); the rest equals masking those neurons."""
    model, original = tiny_prune.build_encoder(), tiny_prune.build_encoder()
    tokens = tiny_prune.tokens(1)
    config = PruneConfig(ratio=0.25, targets=("ffn",), per_layer="uniform", round_to=None)
    cuts, _ = prune_structure(model, (tokens,), config, _magnitude())
    assert {(c.kind, c.before, c.after) for c in cuts} == {("ffn", 64, 48)}
    masked = tiny_prune.build_encoder()
    for layer, old, mask_layer in zip(model.layers, original.layers, masked.layers, strict=True):
        assert layer.attention.query.out_features == 32 and layer.norm1.normalized_shape == (32,)
        kept = _kept_rows(layer.intermediate.weight, old.intermediate.weight)
        with torch.no_grad():
            for n in sorted(set(range(64)) - set(kept)):
                mask_layer.output.weight[:, n] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), masked(tokens), atol=1e-5, rtol=1e-5)


def test_auto_ratios_differ_per_layer_and_keep_the_total(tmp_path: Path) -> None:
    """per_layer auto ranks all layers together: the total share holds, a layer may lose more or less."""
    model = tiny_prune.build_encoder()
    with torch.no_grad():  # make layer 1's FFN matter far less than layer 0's
        model.layers[1].intermediate.weight.mul_(0.01)
    config = PruneConfig(ratio=0.25, targets=("ffn",), per_layer="auto", round_to=None)
    cuts, _ = prune_structure(model, (tiny_prune.tokens(),), config, _magnitude())
    widths = {c.name: c.after for c in cuts}
    assert sum(64 - w for w in widths.values()) == pytest.approx(32, abs=2)
    assert widths["layers.1.intermediate"] < widths.get("layers.0.intermediate", 64)


def test_pruned_checkpoint_loads_weights_only_and_rebuilds_the_model(tmp_path: Path) -> None:
    """pruned.pt: torch.load(weights_only=True) reads it; load_pruned rebuilds the smaller model exactly."""
    model, original = tiny_prune.build_encoder(), tiny_prune.build_encoder()
    tokens = tiny_prune.tokens()
    cuts, _ = prune_structure(model, (tokens,), PruneConfig(ratio=0.25, head_ratio=0.5, round_to=None), _magnitude())
    path = tmp_path / "pruned.pt"
    save_pruned(path, f"{HERE / 'tiny_prune.py'}:build_encoder", original, model, {"cuts": []})
    payload = torch.load(path, weights_only=True)
    heads = [payload["sizes"].get(f"layers.{i}.attention", {}).get("num_attention_heads", 4) for i in (0, 1)]
    assert sum(heads) == 4 and min(heads) >= 1  # per_layer auto: half the heads of the model, split by importance
    rebuilt = load_pruned(path)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(tokens), model(tokens))


def test_no_prunable_layer_is_a_one_line_error() -> None:
    model = tiny_prune.build_cnn()
    with pytest.raises(ModelError, match="matches no prunable layer"):
        prune_structure(model, (torch.randn(2, 1, 8, 8),), PruneConfig(ratio=0.3, targets=("ffn",)), _magnitude())


def test_prune_config_is_checked() -> None:
    from deploy_opt.config.build import resolve_config

    base = {"name": "x", "data": {"calibration": "a:b", "evaluation": "a:c"}}
    with pytest.raises(ConfigError, match="prune needs model.factory"):
        resolve_config(base | {"model": {"onnx": "m.onnx"}}, {}, ["prune.ratio=0.3"], ".")
    with pytest.raises(ConfigError, match=r"prune.ratio must be in \[0, 1\)"):
        PruneConfig(ratio=1.2)
    with pytest.raises(ConfigError, match="is not allowed"):
        resolve_config(base | {"model": {"onnx": "m.onnx"}}, {}, ["prune.method=random"], ".")
    assert not PruneConfig().enabled and PruneConfig(head_ratio=0.25).enabled


def test_the_gate_judges_a_pruned_build_against_the_original() -> None:
    """drop_vs names the unpruned model: a pruned FP32 that matches its own INT8 still fails on the real drop."""
    build = {
        "metrics": {
            "name": "top1",
            "ort_fp32_original": 98.0,
            "ort_fp32": 95.0,
            "ort_int8": 95.0,
            "drop": 3.0,
            "drop_vs": "ort_fp32_original",
        },
        "benchmark": {"batches": {"8": {"speedup": 1.0, "speedup_int8_vs_original": 2.6}}},
        "quantization": {"quantized_nodes": 4},
    }
    result = _judge(build, 1.0, 2.5)
    drop, speed = result.criteria
    assert not drop.passed and "unpruned FP32 98.000 → INT8 95.000" in drop.text
    assert speed.passed and speed.measured == 2.6 and "over the unpruned FP32" in speed.text


@pytest.mark.slow
def test_a_pruned_build_is_judged_against_the_unpruned_model(tmp_path: Path) -> None:
    """A real build with prune on: the reference, the stage table, pruned.pt, prune.png; no original left."""
    from conftest import write_config

    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.build import run_build

    source = HERE / "tiny_prune.py"
    text = f"""
name: pruned
model:
  factory: "{source}:build_cnn"
  inputs: [{{name: image, shape: [batch, 1, 8, 8], dtype: float32}}]
data: {{calibration: "{source}:calibration", evaluation: "{source}:evaluation", metric: top1}}
benchmark: {{batch_sizes: [8], repeats: 3, warmup: 1, max_seconds: 1}}
prune: {{ratio: 0.5, distill: {{steps: 30}}}}
gate: {{max_drop: 50}}
"""
    config, profile = load_build_config(write_config(tmp_path, text), "ci", ["quantization.mode=manual"])
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    build = json.loads((result.out_dir / "build.json").read_text())
    metrics = build["metrics"]
    assert metrics["drop_vs"] == "ort_fp32_original" and metrics["ort_fp32_original"] == pytest.approx(100.0)
    assert metrics["drop"] == pytest.approx(metrics["ort_fp32_original"] - metrics["ort_int8"])
    assert metrics["drop_pruned_fp32"] == pytest.approx(metrics["ort_fp32_original"] - metrics["ort_fp32"])
    drop = next(c for c in build["gate"]["criteria"] if c["name"] == "max_drop")
    assert drop["measured"] == pytest.approx(metrics["drop"]) and "unpruned FP32" in drop["text"]
    prune = build["prune"]
    assert [r["stage"] for r in prune["stages"]] == ["original", "pruned", "distilled", "int8"]
    assert prune["removed"]["channels"] == {"before": 16, "after": 8, "layers": 1, "ratio": 0.5}
    assert prune["stages"][0]["params"] > prune["stages"][2]["params"]
    assert "speedup_int8_vs_original" in build["benchmark"]["batches"]["8"]
    assert (result.out_dir / "prune.png").is_file() and not (result.out_dir / "original").exists()
    rebuilt = load_pruned(result.out_dir / "pruned.pt")
    assert rebuilt.head.in_features == 8
    assert "## Pruning" in (result.out_dir / "summary.md").read_text()
