"""``method: auto`` / ``group_size: auto``: the default resolves to a checkpoint that an lmdeploy 0.18 engine serves."""

from __future__ import annotations

import re

import pytest

from deploy_opt.llm.config import LLMQuantConfig, load_llm_config
from deploy_opt.llm.scheme import layout_of, resolve_scheme
from dopt_common.errors import ConfigError

torch = pytest.importorskip("torch")

SMOLLM2 = {"model.layers.0.self_attn.q_proj": 576, "model.layers.0.mlp.down_proj": 1536}  # hidden 576
DIVIDES_128 = {"model.layers.0.self_attn.q_proj": 128, "model.layers.0.mlp.down_proj": 256}


def _qconfig(method: str, group: int, in_features: int, *, desc_act: bool = False, sym: bool = True) -> dict:
    """The quantization_config our writer puts in config.json for codes of this scheme."""
    from calibrators.groupwise.rtn import QuantizedWeight, rtn_quantize
    from exporters.lmdeploy import quantization_config

    qw = rtn_quantize(torch.randn(16, in_features, generator=torch.Generator().manual_seed(0)), 4, group, sym)
    if desc_act:  # act-order: a g_idx that is not column // group
        qw = QuantizedWeight(qw.qweight, qw.scales, qw.zeros, qw.g_idx.flip(0), 4, group, sym)
    return quantization_config(layout_of(method), {"layer": qw})


def test_the_defaults_are_auto_without_act_order() -> None:
    quant = load_llm_config(None).quantization
    assert (quant.method, quant.group_size, quant.desc_act, quant.symmetric) == ("auto", "auto", False, True)
    flags = load_llm_config(None, {"quantization": {"method": "gptq", "group_size": "auto"}}).quantization
    assert (flags.method, flags.group_size) == ("gptq", "auto")


@pytest.mark.parametrize(
    ("quant", "match"),
    [
        ({"desc_act": True}, "desc_act true with method auto.*--no-desc-act"),
        ({"group_size": 100}, "group_size 100: use auto"),
        ({"group_size": "large"}, "group_size"),
        ({"method": "gptq4"}, "'gptq4' is not allowed; use one of auto"),
    ],
)
def test_bad_quantization_settings_name_the_field(quant: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_llm_config(None, {"quantization": quant})


@pytest.mark.parametrize(
    ("quant", "dims", "expected", "engine", "reason"),
    [
        ({}, DIVIDES_128, ("awq-gptq", 128, False, False), "turbomind", "both serve; group_size auto: 128 divides"),
        ({}, SMOLLM2, ("awq-gptq", 64, False, False), "pytorch", r"128 does not divide .*q_proj \(in_features 576\)"),
        ({}, {"q": 96}, ("awq-gptq", 32, False, False), "pytorch", "32 divides every"),
        ({"symmetric": False}, DIVIDES_128, ("awq-gptq", 128, False, False), "turbomind", "AWQ layout at group 128"),
        ({"group_size": 64}, DIVIDES_128, ("awq-gptq", 64, False, False), "pytorch", "group_size 64 as configured"),
        ({"group_size": 128}, DIVIDES_128, ("awq-gptq", 128, False, False), "turbomind", "group_size 128 as"),
        ({"method": "awq-gptq"}, SMOLLM2, ("awq-gptq", 64, False, False), "pytorch", "awq-gptq as configured"),
        # explicit methods are kept: act-order GPTQ quantizes, and no engine serves it
        ({"method": "gptq", "desc_act": True}, SMOLLM2, ("gptq", 64, True, True), None, "method gptq as configured"),
        ({"method": "gptq"}, DIVIDES_128, ("gptq", 128, False, True), "turbomind", "as configured"),
        ({"method": "awq", "group_size": 32}, SMOLLM2, ("awq", 32, False, False), "pytorch", "as configured"),
    ],
)
def test_auto_resolves_to_what_lmdeploy_serves(
    quant: dict, dims: dict, expected: tuple, engine: str | None, reason: str
) -> None:
    from exporters.lmdeploy_engines import serving_engine

    scheme = resolve_scheme(LLMQuantConfig(**quant), dims)
    assert (scheme.method, scheme.group_size, scheme.desc_act, scheme.symmetric) == expected
    assert re.search(reason, scheme.reason), scheme.reason
    record = scheme.to_json()
    assert record["requested"]["method"] == quant.get("method", "auto") and record["method"] == scheme.method
    assert record["layout"] == ("awq" if scheme.method.startswith("awq") else "gptq")
    qconfig = _qconfig(
        scheme.method, scheme.group_size, min(dims.values()), desc_act=scheme.desc_act, sym=scheme.symmetric
    )
    assert serving_engine(qconfig) == engine


@pytest.mark.parametrize("arch", ["MistralForCausalLM", "Phi3ForCausalLM", "GemmaForCausalLM"])
def test_auto_writes_the_awq_layout_for_an_architecture_turbomind_lacks(arch: str) -> None:
    from exporters.lmdeploy_engines import serving_engine

    scheme = resolve_scheme(LLMQuantConfig(), DIVIDES_128, arch)
    assert (scheme.method, scheme.layout, scheme.group_size, scheme.symmetric) == ("awq-gptq", "awq", 128, False)
    assert f"{arch} is not in TurboMind's list" in scheme.reason
    qconfig = _qconfig("awq", 128, min(DIVIDES_128.values()))
    assert serving_engine(qconfig, arch) == "pytorch"
    assert serving_engine(_qconfig("gptq", 128, min(DIVIDES_128.values())), arch) is None  # what auto avoids
    llama = resolve_scheme(LLMQuantConfig(), DIVIDES_128, "LlamaForCausalLM")
    assert (llama.method, llama.group_size) == ("awq-gptq", 128) and "TurboMind and PyTorch engine" in llama.reason


def test_auto_refuses_a_model_no_auto_group_divides() -> None:
    with pytest.raises(ConfigError, match=r"none of 128, 64, 32 divides q \(in_features 48\).*--group-size"):
        resolve_scheme(LLMQuantConfig(), {"q": 48})


def test_default_run_name_comes_from_the_model_and_method() -> None:
    from deploy_opt.llm.pipeline import default_run_name
    from deploy_opt.llm.scheme import QuantScheme

    def scheme(method: str, group: int) -> QuantScheme:
        return QuantScheme(method, group, False, True, "", {})

    assert default_run_name("smollm2", scheme("awq", 64)) == "smollm2-awq-g64"
    assert default_run_name("smollm2", scheme("awq-gptq", 64)) == "smollm2-awq-gptq-g64"
    assert default_run_name("/models/Llama-3.2-1B/", scheme("gptq", 128)) == "Llama-3.2-1B-gptq-g128"
    assert default_run_name("weights/tiny.Q8_0.gguf", scheme("rtn", 32)) == "tiny.Q8_0-rtn-g32"
    assert default_run_name("/m/llama", scheme("torchao-int8-wo", 128)) == "llama-torchao-int8-wo"


def test_gguf_format_fixes_group_32_and_picks_the_block_type() -> None:
    from deploy_opt.llm.config import LLMQuantConfig
    from deploy_opt.llm.scheme import resolve_scheme

    widths = {"q_proj": 576, "down_proj": 1536}
    auto = resolve_scheme(LLMQuantConfig(format="gguf"), widths)
    assert (auto.method, auto.group_size, auto.symmetric, auto.desc_act) == ("gptq", 32, True, False)
    assert "Q4_0" in auto.reason
    awq = resolve_scheme(LLMQuantConfig(format="gguf", method="awq"), widths)
    assert (awq.method, awq.symmetric) == ("awq", False) and "Q4_1" in awq.reason
    mixed = resolve_scheme(LLMQuantConfig(format="gguf", method="awq-gptq"), widths)
    assert (mixed.layout, mixed.symmetric, auto.layout) == ("gguf", False, "gguf") and "Q4_1" in mixed.reason
    with pytest.raises(ConfigError, match="blocks of 32 do not divide"):
        resolve_scheme(LLMQuantConfig(format="gguf"), {"odd": 48})


def test_auto_falls_back_to_static_group_gptq_in_the_awq_layout_where_awq_has_no_groups(tmp_path) -> None:
    """A family the architecture table gives no AWQ scale groups: auto says so and writes act-order GPTQ in static
    groups, asymmetric, whose codes the AWQ layout holds and lmdeploy's PyTorch engine serves."""
    import transformers

    from deploy_opt.llm.quantize_engine import quantize_model
    from deploy_opt.llm.run_common import engine_settings
    from deploy_opt.llm.scheme import serving_config
    from exporters.lmdeploy import read_quantized_weights
    from exporters.lmdeploy_engines import serving_engine
    from exporters.w4a16_writer import write_quantized_checkpoint

    scheme = resolve_scheme(LLMQuantConfig(), DIVIDES_128, "LlamaForCausalLM", awq_groups=False)
    assert (scheme.method, scheme.layout, scheme.group_size) == ("gptq", "awq", 128)
    assert scheme.desc_act and scheme.static_groups and not scheme.symmetric
    assert "no AWQ scale groups" in scheme.reason and scheme.to_json()["static_groups"] is True
    assert serving_engine(serving_config(scheme), "LlamaForCausalLM") in ("turbomind", "pytorch")
    settings = engine_settings(LLMQuantConfig(), scheme)
    assert (settings.method, settings.desc_act, settings.static_groups, settings.symmetric) == (
        "gptq",
        True,
        True,
        False,
    )
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4
    )
    model = transformers.LlamaForCausalLM(config).eval()
    samples = [torch.randint(0, 64, (1, 32)) for _ in range(4)]
    weights = quantize_model(model, samples, settings, progress=False).weights
    folder = write_quantized_checkpoint(model, weights, tmp_path / "checkpoint", fmt=scheme.layout)
    back, _ = read_quantized_weights(folder)
    for name, qw in weights.items():
        assert not qw.act_order and torch.equal(qw.g_idx.long(), torch.arange(qw.shape[1]) // 128), name
        torch.testing.assert_close(back[name].dequantize(), model.get_submodule(name).weight, rtol=2e-3, atol=1e-5)
