"""Quantization-aware training: the fake-quant gradients, the student graph, and QAT inside a real build."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from conftest import assert_qat_no_worse_than_its_start, build_tiny  # noqa: E402

from calibrators.scales.format import load_scale_file  # noqa: E402
from deploy_opt.config.qat import QATConfig  # noqa: E402
from deploy_opt.data.sources import Batch  # noqa: E402
from deploy_opt.distill.loop import Lessons  # noqa: E402
from deploy_opt.distill.losses import choose_loss, distill_loss, is_distribution  # noqa: E402
from deploy_opt.evaluation.metrics import resolve_metric  # noqa: E402
from deploy_opt.qat.fake_quant import fake_quantize, fake_quantize_reference, fake_quantize_weight  # noqa: E402
from deploy_opt.qat.student import build_student, learned_ranges, run_student, trained_model  # noqa: E402
from deploy_opt.qat.train import split_minibatches, train_student  # noqa: E402
from dopt_common.errors import ConfigError  # noqa: E402
from dopt_common.files import sha256_file  # noqa: E402


def _finite_difference(fn, value: float, eps: float = 1e-4) -> float:
    return (fn(value + eps) - fn(value - eps)) / (2 * eps)


def test_clipped_values_have_the_finite_difference_gradient() -> None:
    """Outside the range the output is (qmax - z) * s: d/dx = 0 and d/ds = qmax - z, exactly the FD."""
    scale, zero = 0.1, 10
    for x0, code in ((40.0, 255), (-5.0, 0)):
        x = torch.tensor([x0], dtype=torch.float64, requires_grad=True)
        s = torch.tensor(scale, dtype=torch.float64, requires_grad=True)
        fake_quantize(x, s, zero, 0, 255).sum().backward()

        def of_s(v: float, x0: float = x0) -> float:
            return float(
                fake_quantize(
                    torch.tensor([x0], dtype=torch.float64), torch.tensor(v, dtype=torch.float64), zero, 0, 255
                )
            )

        def of_x(v: float) -> float:
            return float(
                fake_quantize(
                    torch.tensor([v], dtype=torch.float64), torch.tensor(scale, dtype=torch.float64), zero, 0, 255
                )
            )

        assert float(s.grad) == pytest.approx(_finite_difference(of_s, scale), abs=1e-6)
        assert float(s.grad) == pytest.approx(code - zero)
        assert float(x.grad) == pytest.approx(_finite_difference(of_x, x0), abs=1e-9) == 0.0


def test_inside_the_range_the_gradient_is_straight_through_and_lsq() -> None:
    """Inside: d/dx = 1 (the STE, the FD of the unrounded map) and d/ds = round(x/s) - x/s (LSQ)."""
    x = torch.tensor([0.234, -0.61], dtype=torch.float64, requires_grad=True)
    s = torch.tensor(0.01, dtype=torch.float64, requires_grad=True)
    fake_quantize(x, s, 128, 0, 255, grad_factor=0.5).sum().backward()
    assert torch.allclose(x.grad, torch.ones(2, dtype=torch.float64))
    ratio = x.detach() / 0.01
    assert float(s.grad) == pytest.approx(0.5 * float((torch.round(ratio) - ratio).sum()))


def test_the_fused_kernel_is_the_reference_maths() -> None:
    """float32 runs torch's fused LSQ kernel; its output and gradients equal the plain-op version."""
    x = (torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(0)) * 3).requires_grad_(True)
    grads = []
    for fn in (fake_quantize, fake_quantize_reference):
        s = torch.tensor(0.05, requires_grad=True)
        y = fn(x, s, 100, 0, 255, 0.01)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        grads.append((y.detach(), x.grad.clone(), float(s.grad)))
        x.grad = None
    (y1, gx1, gs1), (y2, gx2, gs2) = grads
    assert torch.equal(y1, y2)
    torch.testing.assert_close(gx1, gx2, atol=1e-6, rtol=0)
    assert gs1 == pytest.approx(gs2, rel=1e-4)


def test_weight_fake_quant_is_per_channel_absmax() -> None:
    weight = torch.tensor([[1.0, -0.5, 0.25], [0.01, 0.02, -0.03]], requires_grad=True)
    out = fake_quantize_weight(weight, 0, 127)
    assert torch.allclose(out[0], weight[0], atol=1.0 / 127)
    assert float(out[1].detach().abs().max()) == pytest.approx(0.03, rel=1e-6)  # its own scale, not row 0's
    out.sum().backward()
    assert torch.equal(weight.grad, torch.ones_like(weight))


def test_student_gradient_matches_the_finite_difference_without_fake_quant(tiny_qdq) -> None:
    """Through the torch evaluator of the ONNX graph, d loss / d weight equals the central difference."""
    student, batch = tiny_qdq["student"], tiny_qdq["batches"][0]
    name = next(iter(student.weights))
    weight = student.weights[name]
    loss = run_student(student, batch.inputs, quantized=False)[0].pow(2).sum()
    loss.backward()
    index = tuple(np.unravel_index(int(weight.grad.abs().argmax()), weight.shape))

    def at(value: float) -> float:
        with torch.no_grad():
            saved = float(weight[index])
            weight[index] = value
            out = float(run_student(student, batch.inputs, quantized=False)[0].double().pow(2).sum())
            weight[index] = saved
        return out

    fd = _finite_difference(at, float(weight.detach()[index]), eps=1e-2)
    assert float(weight.grad[index]) == pytest.approx(fd, rel=2e-2)


def test_student_starts_where_the_qdq_model_is(tiny_qdq) -> None:
    """At step 0 the fake-quantized student computes what ORT computes on the Q/DQ model."""
    from dopt_common.ort import create_session

    student, batch = tiny_qdq["student"], tiny_qdq["batches"][0]
    session = create_session(tiny_qdq["qdq_path"], threads=1)
    ort_out = session.run(None, batch.inputs)[0]
    with torch.no_grad():
        ours = run_student(student, batch.inputs)[0].numpy()
    fp32 = run_student(student, batch.inputs, quantized=False)[0].detach().numpy()
    assert np.abs(ours - ort_out).max() < 0.05 * np.abs(fp32 - ort_out).max() + 1e-4


def test_learned_scales_stay_positive_and_finite(tiny_qdq) -> None:
    """Even with a scale learning rate far too high, the step sizes stay positive and finite."""
    student, batches = tiny_qdq["student"], tiny_qdq["batches"]
    qat = QATConfig(enabled=True, steps=30, lr=1e-3, scale_lr=0.5, batch_size=8, budget_s=60)
    run = train_student(student, qat, Lessons(batches, batches[:2], resolve_metric("top1")), progress=False)
    assert run.steps == 30
    for log_scale in student.log_scales.values():
        assert torch.isfinite(log_scale.detach()) and float(torch.exp(log_scale.detach())) > 0
    for low, high in learned_ranges(student).values():
        assert np.isfinite(low) and np.isfinite(high) and low <= 0 <= high and high > low


def test_training_lowers_the_validation_loss_and_writes_weights_back(tiny_qdq) -> None:
    """From deliberately coarse activation steps (4x PTQ's), training recovers: the validation loss falls."""
    student, batches = tiny_qdq["student"], tiny_qdq["batches"]
    with torch.no_grad():
        for log_scale in student.log_scales.values():
            log_scale += float(np.log(4.0))
    before = {k: v.detach().clone() for k, v in student.weights.items()}
    qat = QATConfig(enabled=True, steps=60, lr=1e-3, scale_lr=0.02, batch_size=8, budget_s=60)
    run = train_student(student, qat, Lessons(batches, batches[:2], resolve_metric("top1")), progress=False)
    first, best = run.validation_loss[0][1], min(v for _, v in run.validation_loss)
    assert best < first and run.best_step > 0
    model = trained_model(student)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    changed = [k for k in before if not np.array_equal(inits[k], before[k].numpy())]
    assert changed and all(np.array_equal(inits[k], student.weights[k].detach().numpy()) for k in changed)


def test_a_run_over_budget_keeps_its_best_checkpoint(tiny_qdq) -> None:
    student, batches = tiny_qdq["student"], tiny_qdq["batches"]
    qat = QATConfig(enabled=True, steps=10_000, lr=1e-3, batch_size=8, budget_s=0.5)
    run = train_student(student, qat, Lessons(batches, [], resolve_metric("top1")), progress=False)
    assert run.stopped == "budget" and run.steps < 10_000
    keys = {s: (-m, loss) for (s, m), (_, loss) in zip(run.validation_metric, run.validation_loss, strict=True)}
    assert run.best_step == min(keys, key=keys.get)


def test_minibatches_hold_out_validation_and_never_mix_batches() -> None:
    batches = [Batch({"x": np.arange(20, dtype=np.float32).reshape(10, 2) + 100 * k}, None) for k in range(3)]
    train, validation = split_minibatches(batches, 4, 0.25, seed=0)
    pieces = train + validation
    assert sum(p.size for p in pieces) == 30 and len(validation) == 2
    for piece in pieces:
        assert np.ptp(piece.inputs["x"] // 100) == 0  # every row from one source batch


def test_losses_choose_and_compare() -> None:
    probs = torch.softmax(torch.randn(4, 5), -1)
    assert is_distribution(probs) and not is_distribution(torch.randn(4, 5))
    assert choose_loss("auto", "mse", probs) == "kl"
    assert choose_loss("auto", "cosine", torch.randn(4, 5)) == "cosine"
    assert choose_loss("auto", "top1", torch.randn(4, 5)) == "kl"
    assert choose_loss("auto", "my.py:score", torch.randn(4, 5)) == "mse"
    logits = torch.randn(4, 5)
    for kind in ("kl", "mse", "cosine"):
        assert float(distill_loss(kind, logits, logits)) == pytest.approx(0.0, abs=1e-5)
        assert float(distill_loss(kind, logits + torch.randn(4, 5), logits)) > 0.0
    assert float(distill_loss("kl", probs, probs)) == pytest.approx(0.0, abs=1e-6)


def test_qat_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="quantization.qat.steps"):
        QATConfig(steps=0)
    with pytest.raises(ConfigError, match="quantization.qat.lr"):
        QATConfig(lr=float("nan"))
    with pytest.raises(ConfigError, match="validation"):
        QATConfig(validation=0.9)


def test_a_bring_your_own_onnx_graph_trains_and_ships_verified_scales(tmp_path) -> None:
    """No torch factory: the build fine-tunes the ONNX graph itself; align verify and compare judge the result."""
    # min/max ranges: this test judges QAT against plain PTQ, not the auto range choice (which on this 2-node
    # model already reaches QAT's drop, so QAT rightly would not ship)
    result = build_tiny(
        tmp_path,
        "quantization: {qat: {enabled: true, steps: 40, batch_size: 8}}",
        ["calibration.method=minmax", "quantization.weight_range=full"],  # one answer on CPUs with and without VNNI
    )
    build, out = result.build.to_json(), result.out_dir
    qat = build["qat"]
    assert qat["ran"] and qat["training"]["steps"] == 40
    assert (out / "qat.png").stat().st_size > 1000
    assert build["alignment"]["verdict"].startswith("pass"), build["alignment"]
    compare = json.loads((out / "compare.json").read_text())
    assert "ort_int8" in json.dumps(compare)
    scales = load_scale_file(out / "scales.json")
    assert qat["shipped"] == "qat", qat["why"]
    assert scales.provenance["qat"]["steps"] == 40
    assert scales.provenance["model_sha256"] == sha256_file(out / "model.qat.onnx")
    assert any(t.method == "qat" for t in scales.tensors.values())
    # QAT's rows are the decision half's numbers (what chose it): the shipped model's score on that half
    assert build["metrics"]["decision"]["ort_int8"] == pytest.approx(qat["rows"]["qat"]["metric"])
    assert "ort_int8_ptq" in build["metrics"]
    summary = (out / "summary.md").read_text()
    assert "## Quantization-aware training" in summary and "| QAT | " in summary


@pytest.fixture
def tiny_qdq(tmp_path):
    """The tiny ONNX MLP quantized by a real (manual, PTQ) build, and its student."""
    import tiny_onnx

    result = build_tiny(tmp_path, "")
    out = result.out_dir
    fp32 = onnx.load(str(out / "model.onnx"))
    qdq_path = out / "model.int8.onnx"
    from deploy_opt.stages.quantize import weight_levels

    config = result.build.config  # the build's weight levels: 7-bit on a CPU without VNNI, as the build wrote
    levels = weight_levels(config["quantization"]["weight_range"], tuple(config["deploy"]["targets"]))[0]
    student = build_student(fp32, onnx.load(str(qdq_path)), load_scale_file(out / "scales.json"), levels)
    batches = [Batch({"x": x["x"] if isinstance(x, dict) else x}, y) for x, y in tiny_onnx.calibration()]
    return {"student": student, "batches": batches, "qdq_path": qdq_path}


@pytest.mark.slow
def test_qat_never_ends_worse_than_its_ptq_start(tmp_path) -> None:
    """On the demo (defaults otherwise), the model QAT writes scores no worse than its PTQ start, measured by ORT
    on the held-out evaluation set; the shipped model passes align verify. MiniLM's is checked on the MiniLM build
    of tests/test_build.py."""
    from deploy_opt.config.profiles import example_config, load_build_config
    from deploy_opt.pipeline.build import run_build

    sets = ["quantization.mode=manual", "benchmark.enabled=false", "quantization.qat.enabled=true"]
    sets += ["quantization.qat.steps=30", "quantization.qat.eval_every=10"]
    config, profile = load_build_config(example_config("digits"), "ci", sets)
    assert_qat_no_worse_than_its_start(run_build(config, profile, tmp_path, progress=False).build.to_json())


def test_qat_ships_only_when_it_meets_the_gate_and_beats_ptqs_answer() -> None:
    from deploy_opt.pipeline.qat import choose_model

    top1 = resolve_metric("top1")

    def choose(ptq: float, qat: float, ptq_nodes: int = 10, qat_nodes: int = 12, start: float | None = None) -> str:
        scores = {"ort_fp32": 90.0, "ptq": 90.0 - ptq, "qat": 90.0 - qat}
        nodes = {"ptq": ptq_nodes, "qat": qat_nodes}
        if start is not None:
            scores["ptq_all_int8"], nodes["ptq_all_int8"] = 90.0 - start, qat_nodes
        return choose_model(top1, scores, nodes, 1.0)

    assert choose(ptq=0.5, qat=0.9) == "qat"  # inside the gate with more nodes in INT8 (faster)
    assert choose(ptq=0.5, qat=0.9, qat_nodes=10) == "ptq"  # same nodes, less accurate
    assert choose(ptq=0.5, qat=0.5, qat_nodes=10) == "ptq"  # an exact tie: the model that changed least
    assert choose(ptq=4.0, qat=0.8, qat_nodes=10) == "qat"  # PTQ misses the gate, QAT meets it
    assert choose(ptq=4.0, qat=1.5, qat_nodes=10) == "qat"  # both miss: QAT is closer with as many nodes
    assert choose(ptq=0.2, qat=1.5) == "ptq"  # QAT misses the gate PTQ meets
    assert choose(ptq=0.0, qat=0.8, ptq_nodes=0) == "qat"  # PTQ's answer was FP32
    assert choose(ptq=0.0, qat=1.2, ptq_nodes=0) == "ptq"  # ... and QAT is not good enough either
    assert choose(ptq=0.5, qat=0.9, start=0.6) == "ptq_all_int8"  # QAT ended below its start: the start ships
    assert choose(ptq=3.0, qat=2.0, start=1.5, ptq_nodes=12) == "ptq_all_int8"


def test_auto_runs_qat_only_when_ptq_misses_the_gate(tmp_path) -> None:
    result = build_tiny(tmp_path, "quantization: {qat: {enabled: auto}}\ngate: {max_drop: 50}")
    qat = result.build.qat
    assert qat["ran"] is False and "QAT not needed" in qat["why"]
    assert not (result.out_dir / "qat.png").exists()


def test_data_train_adds_training_batches(tmp_path) -> None:
    import tiny_onnx
    from conftest import HERE

    from deploy_opt.config.build import resolve_config
    from deploy_opt.config.model import InputSpec
    from deploy_opt.stages.inputs import training_batches

    model = tiny_onnx.make_model(tmp_path / "tiny.onnx")
    source = HERE / "tiny_onnx.py"
    data = {
        "calibration": f"{source}:calibration",
        "evaluation": f"{source}:evaluation",
        "train": f"{source}:calibration",
    }
    config = resolve_config({"name": "t", "model": {"onnx": model.name}, "data": data}, {}, [], str(tmp_path))
    batches = training_batches(config.data, config.base_dir, (InputSpec("x", ("batch", tiny_onnx.FEATURES)),))
    assert sum(b.size for b in batches) == 128 and set(batches[0].inputs) == {"x"}
    with pytest.raises(ConfigError, match="data.train and data.evaluation"):
        resolve_config(
            {"name": "t", "model": {"onnx": model.name}, "data": {**data, "train": data["evaluation"]}},
            {},
            [],
            str(tmp_path),
        )


def test_a_failed_auto_run_keeps_ptqs_answer_and_says_why(tmp_path, monkeypatch) -> None:
    """enabled: auto is the default, so a QAT failure must not cost the user the PTQ build."""
    import deploy_opt.pipeline.qat as stage

    def broken(*_args, **_kwargs):
        raise RuntimeError("simulated failure inside the torch evaluator")

    monkeypatch.setattr(stage, "train_student", broken)
    result = build_tiny(tmp_path, "quantization: {qat: {enabled: auto}}", unmeetable=True)
    qat = result.build.qat
    assert qat["ran"] is False and "QAT failed (RuntimeError: simulated failure" in qat["why"]
    assert "PTQ's answer stands" in qat["why"]
    assert result.build.quantization.quantized_nodes > 0
    (tmp_path / "true").mkdir()
    with pytest.raises(RuntimeError, match="simulated"):
        build_tiny(tmp_path / "true", "quantization: {qat: {enabled: true}}")
