"""The W4A16 engine (GPTQ, AWQ, RTN), the GPTQ/AWQ checkpoint packers and the torchao path, on a tiny Llama."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import tiny_llama
import torch

from calibrators.groupwise.awq import search_awq_scale
from calibrators.groupwise.gptq import HessianAccumulator, gptq_quantize
from calibrators.groupwise.rtn import QuantizedWeight, output_error, rtn_quantize
from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model
from dopt_common.errors import CalibrationError, ConfigError
from exporters.lmdeploy import (
    AWQ_ORDER,
    load_quantized_checkpoint,
    pack_awq,
    pack_gptq,
    read_quantized_weights,
    unpack_awq,
    unpack_gptq,
)
from exporters.w4a16_writer import write_quantized_checkpoint

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama.make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def base_model(llama_dir: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(llama_dir).eval()


@pytest.fixture(scope="module")
def samples() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 500, (1, 64), generator=gen) for _ in range(8)]


def _quantized(base_model, samples, **kwargs):
    model = copy.deepcopy(base_model)
    return model, quantize_model(model, samples, EngineSettings(**kwargs), progress=False)


# ---------- the engine ----------


@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize(
    "method,extra",
    [("gptq", {"desc_act": True}), ("gptq", {"desc_act": False}), ("awq", {}), ("awq-gptq", {}), ("rtn", {})],
)
def test_engine_quantizes_every_linear(base_model, samples, method, extra, group_size):
    model, result = _quantized(base_model, samples, method=method, group_size=group_size, **extra)
    assert len(result.records) == 14 and set(result.weights) == {r.name for r in result.records}
    for record in result.records:
        qw = result.weights[record.name]
        assert qw.group_size == group_size and qw.qweight.min() >= 0 and qw.qweight.max() <= 15
        assert torch.equal(model.get_submodule(record.name).weight, qw.dequantize())
        assert 0 < record.weight_error < 0.3 and 0 < record.output_error < 0.1
    before, after = base_model.state_dict(), model.state_dict()
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        assert torch.equal(before[key], after[key])
    norms = [k for k in before if "norm" in k]
    if method.startswith("awq"):  # scales are folded into the norms, which stay float
        assert any(not torch.equal(before[k], after[k]) for k in norms)
        assert all(not qw.act_order for qw in result.weights.values())  # AWQ's layout: groups in column order
    else:
        assert all(torch.equal(before[k], after[k]) for k in norms)
    assert result.sym == (not method.startswith("awq")) and result.desc_act == extra.get("desc_act", False)


def test_gptq_output_error_not_above_rtn(base_model, samples):
    # Layer 0 sees the same inputs in both runs, so its Linears compare like for like.
    _, gptq = _quantized(base_model, samples, method="gptq", group_size=32)
    _, rtn = _quantized(base_model, samples, method="rtn", group_size=32)
    rtn_errors = {r.name: r.output_error for r in rtn.records}
    layer0 = [r for r in gptq.records if ".layers.0." in r.name]
    assert layer0 and all(r.output_error <= rtn_errors[r.name] for r in layer0)


def test_group_size_that_divides_nothing_is_refused_before_work(base_model, samples):
    model = copy.deepcopy(base_model)
    message = (
        r"group_size 128 does not divide model\.layers\.0\.self_attn\.q_proj \(in_features 64\); "
        r"use one of 32, 64, -1"
    )
    with pytest.raises(ConfigError, match=message):
        quantize_model(model, samples, EngineSettings(method="gptq", group_size=128), progress=False)
    before, after = base_model.state_dict(), model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)


@pytest.mark.parametrize("bad", [dict(method="hqq"), dict(bits=3)])
def test_bad_settings_raise_config_error(base_model, samples, bad):
    with pytest.raises(ConfigError):
        settings = EngineSettings(**{"method": "gptq", "group_size": 32, **bad})
        quantize_model(copy.deepcopy(base_model), samples, settings)


def test_keep_pattern_leaves_modules_float(base_model, samples):
    model, result = _quantized(
        base_model, samples, method="rtn", group_size=32, keep=("embed_tokens", "lm_head", "mlp.down_proj")
    )
    assert len(result.records) == 12 and not any("down_proj" in name for name in result.weights)
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, base_model.model.layers[1].mlp.down_proj.weight)


# ---------- the algorithms against independent references ----------


def _correlated_inputs(tokens: int = 2048, features: int = 64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(features, features, generator=gen) / features**0.5
    scale = torch.linspace(0.2, 4.0, features)
    return (torch.randn(tokens, features, generator=gen) @ mix) * scale


def _gptq_algorithm1(w: torch.Tensor, h: torch.Tensor, group_size: int, percdamp: float = 0.01) -> torch.Tensor:
    """GPTQ as the paper's Algorithm 1 without blocks or Cholesky: explicit H⁻¹ with the OBS downdate."""
    w = w.double().clone()
    h = h.double().clone()
    h += percdamp * torch.diag(h).mean() * torch.eye(h.shape[0], dtype=h.dtype)
    hinv = torch.linalg.inv(h)
    maxq = 15
    for j in range(w.shape[1]):
        if j % group_size == 0:
            g = w[:, j : j + group_size]
            absmax = torch.maximum(g.amin(1).abs(), g.amax(1)).clamp(min=1e-12)
            scale = 2 * absmax / maxq
        q = (torch.clamp(torch.round(w[:, j] / scale) + 8, 0, maxq) - 8) * scale
        err = (w[:, j] - q) / hinv[j, j]
        w[:, j:] -= err[:, None] * hinv[j, j:][None, :]
        w[:, j] = q
        hinv = hinv - torch.outer(hinv[:, j], hinv[j, :]) / hinv[j, j]
    return w.float()


def test_gptq_matches_unblocked_algorithm1():
    x = _correlated_inputs()
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(1))
    acc = HessianAccumulator(64, torch.float64)
    for chunk in x.split(500):
        acc.add(chunk)
    h = acc.hessian()
    ours = gptq_quantize(w, h, group_size=32, blocksize=16).dequantize()
    reference = _gptq_algorithm1(w, h, group_size=32)
    differs = (ours - reference).abs() > 1e-4
    # float32 vs float64: a rounding tie may flip a code, and the flip feeds the rest of its row
    assert differs.float().mean() < 0.05
    assert output_error(w, ours, h) == pytest.approx(output_error(w, reference, h), rel=0.02)
    assert output_error(w, ours, h) < 0.9 * output_error(w, rtn_quantize(w, 4, 32).dequantize(), h)


def test_hessian_accumulator_is_2xtx_over_tokens():
    x = _correlated_inputs(tokens=300)
    acc = HessianAccumulator(64, torch.float64)
    for chunk in x.split(7):
        acc.add(chunk[None])
    torch.testing.assert_close(acc.hessian(), 2 * x.double().t() @ x.double() / 300)
    torch.testing.assert_close(acc.mean_abs(), x.abs().mean(0), rtol=1e-5, atol=1e-6)


def test_desc_act_g_idx_follows_autogptq():
    x = _correlated_inputs()
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    h = 2 * x.t() @ x / x.shape[0]
    qw = gptq_quantize(w, h, group_size=16, desc_act=True)
    perm = torch.argsort(torch.diag(h), descending=True)
    expected = torch.empty(64, dtype=torch.int32)
    expected[perm] = (torch.arange(64) // 16).to(torch.int32)
    assert torch.equal(qw.g_idx, expected) and qw.act_order


def test_static_groups_keep_act_order_out_of_the_layout():
    x = _correlated_inputs()
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    h = 2 * x.t() @ x / x.shape[0]
    static = gptq_quantize(w, h, group_size=16, desc_act=True, static_groups=True)
    rtn = rtn_quantize(w, 4, 16)
    assert not static.act_order and torch.equal(static.scales, rtn.scales)  # groups fixed from the original W
    assert output_error(w, static.dequantize(), h) < output_error(w, rtn.dequantize(), h)


def test_given_group_params_are_kept_and_gptq_rounds_inside_them():
    x = _correlated_inputs()
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    h = 2 * x.t() @ x / x.shape[0]
    rtn = rtn_quantize(0.8 * w, 4, 16, sym=False)  # narrower ranges than W's own: GPTQ must clamp into them
    params = (rtn.scales.clone(), rtn.zeros.float())
    qw = gptq_quantize(w, h, group_size=16, sym=False, desc_act=True, group_params=params)
    assert torch.equal(qw.scales, rtn.scales) and torch.equal(qw.zeros, rtn.zeros) and not qw.act_order
    assert qw.qweight.min() >= 0 and qw.qweight.max() <= 15
    group = torch.arange(64) // 16
    scale, zero = rtn.scales[group].t(), rtn.zeros.float()[group].t()
    nearest = (torch.clamp(torch.round(w / scale) + zero, 0, 15) - zero) * scale  # round to nearest, same grid
    assert output_error(w, qw.dequantize(), h) < output_error(w, nearest, h)
    with pytest.raises(CalibrationError, match="group_params shapes"):
        gptq_quantize(w, h, group_size=16, group_params=(rtn.scales.t(), rtn.zeros.float().t()))


def test_awq_gptq_rounds_better_than_awq_in_the_same_ranges():
    from calibrators.groupwise.awq import apply_clip, awq_quantize, search_awq_clip
    from deploy_opt.llm.awq_layer import round_in_ranges

    gen = torch.Generator().manual_seed(4)
    x = _correlated_inputs()
    w = torch.randn(32, 64, generator=gen)
    h = 2 * x.t() @ x / x.shape[0]
    clipped = apply_clip(w, search_awq_clip(w, h, group_size=16), 16)
    ours = round_in_ranges(w, clipped, h, bits=4, group_size=16, sym=False, percdamp=0.01)
    awq = awq_quantize(clipped, 4, 16)
    assert torch.equal(ours.scales, awq.scales) and torch.equal(ours.zeros, awq.zeros)  # AWQ's own ranges
    assert output_error(w, ours.dequantize(), h) < 0.8 * output_error(w, awq.dequantize(), h)


def test_awq_scaling_beats_rtn_on_outlier_channels():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1024, 64, generator=gen)
    x[:, :4] *= 30  # a few salient input channels, as in LLM activations
    w = torch.randn(32, 64, generator=gen)
    acc = HessianAccumulator(64)
    acc.add(x)
    found = search_awq_scale([w], acc.hessian(), acc.mean_abs(), group_size=32)
    assert found.loss < 0.8 * found.base_loss and found.ratio > 0


def test_rtn_sym_is_absmax_over_7_5():
    w = torch.tensor([[-1.5, 0.2, 0.6, 1.0]])
    qw = rtn_quantize(w, 4, -1, True)
    assert qw.scales.item() == pytest.approx(1.5 / 7.5) and qw.zeros.item() == 8
    assert qw.qweight.tolist() == [[0, 9, 11, 13]]


# ---------- packing ----------


def _random_codes(out_features=64, in_features=128, group_size=32, act_order=False, seed=0) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    groups = in_features // group_size
    g_idx = torch.arange(in_features) // group_size
    if act_order:
        g_idx = g_idx[torch.randperm(in_features, generator=gen)]
    return QuantizedWeight(
        qweight=torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.int32),
        scales=(torch.rand(groups, out_features, generator=gen) + 0.01).half().float(),
        zeros=torch.randint(1, 16, (groups, out_features), generator=gen, dtype=torch.int32),
        g_idx=g_idx.to(torch.int32),
        bits=4,
        group_size=group_size,
        sym=False,
    )


def _autogptq_loop_pack(codes: torch.Tensor, zeros: torch.Tensor) -> tuple[list, list]:
    """AutoGPTQ's QuantLinear.pack loops, transcribed with Python ints (uint32 words)."""
    intweight = codes.t().tolist()  # [in][out]
    qweight = [[0] * len(intweight[0]) for _ in range(len(intweight) // 8)]
    for row in range(len(qweight)):
        for j in range(8):
            for col, value in enumerate(intweight[row * 8 + j]):
                qweight[row][col] |= value << (4 * j)
    zs = [[(z - 1) & 0xF for z in group] for group in zeros.tolist()]  # v1 stores zero - 1
    qzeros = [[0] * (len(zs[0]) // 8) for _ in zs]
    for g, group in enumerate(zs):
        for col in range(len(qzeros[g])):
            for j in range(8):
                qzeros[g][col] |= group[col * 8 + j] << (4 * j)
    return qweight, qzeros


def _as_uint32(t: torch.Tensor) -> list:
    return (t.to(torch.int64) & 0xFFFFFFFF).tolist()


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_pack_matches_autogptq_and_round_trips(act_order):
    qw = _random_codes(act_order=act_order)
    packed = pack_gptq(qw)
    assert packed["qweight"].shape == (16, 64) and packed["qzeros"].shape == (4, 8)
    assert packed["qweight"].dtype == torch.int32 and packed["scales"].dtype == torch.float16
    qweight, qzeros = _autogptq_loop_pack(qw.qweight, qw.zeros)
    assert _as_uint32(packed["qweight"]) == qweight and _as_uint32(packed["qzeros"]) == qzeros
    back = unpack_gptq(packed, bits=4, group_size=32, sym=False)
    for field in ("qweight", "zeros", "g_idx", "scales"):
        assert torch.equal(getattr(back, field), getattr(qw, field)), field


def test_awq_pack_matches_autoawq_and_round_trips():
    qw = _random_codes(seed=1)
    packed = pack_awq(qw)
    assert packed["qweight"].shape == (128, 8) and packed["qzeros"].shape == (4, 8)
    intweight = qw.qweight.t().tolist()  # AutoAWQ's WQLinear_GEMM.from_linear loop
    for r in (0, 77):
        for col in range(8):
            word = sum(intweight[r][col * 8 + AWQ_ORDER[i]] << (4 * i) for i in range(8))
            assert _as_uint32(packed["qweight"])[r][col] == word
    back = unpack_awq(packed, group_size=32)
    assert torch.equal(back.qweight, qw.qweight) and torch.equal(back.zeros, qw.zeros)


def test_awq_refuses_act_order_and_gptq_v1_refuses_zero_point_0():
    with pytest.raises(ConfigError, match="g_idx"):
        pack_awq(_random_codes(act_order=True))
    qw = _random_codes()
    zeros = qw.zeros.clone()
    zeros[0, 0] = 0
    with pytest.raises(ConfigError, match="zero - 1"):
        pack_gptq(QuantizedWeight(qw.qweight, qw.scales, zeros, qw.g_idx, 4, 32, False))


# ---------- checkpoints ----------


@pytest.mark.parametrize("method,fmt,extra", [("gptq", "gptq", {"desc_act": True}), ("awq", "awq", {})])
def test_checkpoint_reloads_and_generates_the_same(base_model, samples, llama_dir, tmp_path, method, fmt, extra):
    model, result = _quantized(base_model, samples, method=method, group_size=32, **extra)
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama_dir)
    folder = write_quantized_checkpoint(model, result.weights, tmp_path / "ckpt", fmt=fmt, tokenizer=tokenizer)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    config = transformers.AutoConfig.from_pretrained(folder).quantization_config
    assert config["quant_method"] == fmt and config["group_size"] == 32
    weights, _ = read_quantized_weights(folder)
    for name, qw in result.weights.items():
        assert torch.equal(weights[name].qweight, qw.qweight) and torch.equal(weights[name].zeros, qw.zeros)
    reloaded, reloaded_tokenizer = load_quantized_checkpoint(folder)
    for name in result.weights:
        torch.testing.assert_close(
            reloaded.get_submodule(name).weight, model.get_submodule(name).weight, rtol=2e-3, atol=1e-5
        )
    prompt = reloaded_tokenizer("def quantize(weight):", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**prompt).logits, model(**prompt).logits, rtol=0, atol=5e-3)
        ours = model.generate(**prompt, max_new_tokens=12, do_sample=False)
        theirs = reloaded.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(ours, theirs)


def test_checkpoint_refuses_a_foreign_folder(base_model, samples, tmp_path):
    model, result = _quantized(base_model, samples, method="rtn", group_size=32)
    (tmp_path / "notes.txt").write_text("mine")
    from dopt_common.errors import OutputError

    with pytest.raises(OutputError, match="not a model folder"):
        write_quantized_checkpoint(model, result.weights, tmp_path, fmt="gptq")


# ---------- torchao ----------


def test_torchao_int8_weight_only_runs_and_reloads(base_model, llama_dir, tmp_path):
    pytest.importorskip("torchao")
    from deploy_opt.llm.torchao_path import load_torchao_checkpoint, quantize_torchao, save_torchao_checkpoint

    model = copy.deepcopy(base_model)
    ids = torch.randint(3, 500, (1, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = model(ids).logits
        summary = quantize_torchao(model, "torchao-int8-wo")
        after = model(ids).logits
    assert len(summary["linears"]) == 14 and "lm_head" not in summary["linears"]
    assert (after - before).abs().max() < 0.05 * before.abs().max()
    save_torchao_checkpoint(model, tmp_path / "ao", summary)
    reloaded, _ = load_torchao_checkpoint(tmp_path / "ao")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, after)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="needs a CUDA GPU"):
            quantize_torchao(copy.deepcopy(base_model), "torchao-int4-wo")
