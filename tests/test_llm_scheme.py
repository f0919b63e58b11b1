"""``method: auto`` / ``group_size: auto``: the default resolves to a checkpoint that an lmdeploy 0.18 engine serves."""

from __future__ import annotations

import re

import pytest

from deploy_opt.llm.config import LLMQuantConfig, load_llm_config
from deploy_opt.llm.scheme import resolve_scheme
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
    return quantization_config("awq" if method == "awq" else "gptq", {"layer": qw})


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
        ({}, DIVIDES_128, ("gptq", 128, False, True), "turbomind", "128 divides every"),
        ({}, SMOLLM2, ("awq", 64, False, False), "pytorch", r"128 does not divide .*q_proj \(in_features 576\)"),
        ({}, {"q": 96}, ("awq", 32, False, False), "pytorch", "32 divides every"),
        ({"symmetric": False}, DIVIDES_128, ("awq", 128, False, False), "turbomind", "symmetric is false"),
        ({"group_size": 64}, DIVIDES_128, ("awq", 64, False, False), "pytorch", "group_size 64 as configured"),
        ({"group_size": 128}, DIVIDES_128, ("gptq", 128, False, True), "turbomind", "group_size 128 as configured"),
        # explicit methods are kept: act-order GPTQ quantizes, and no engine serves it
        ({"method": "gptq", "desc_act": True}, SMOLLM2, ("gptq", 64, True, True), None, "method gptq as configured"),
        ({"method": "gptq"}, DIVIDES_128, ("gptq", 128, False, True), "turbomind", "as configured"),
        ({"method": "awq", "group_size": 32}, SMOLLM2, ("awq", 32, False, False), "pytorch", "as configured"),
    ],
)
def test_auto_resolves_to_what_lmdeploy_serves(
    quant: dict, dims: dict, expected: tuple, engine: str | None, reason: str
) -> None:
    from exporters.lmdeploy import serving_engine

    scheme = resolve_scheme(LLMQuantConfig(**quant), dims)
    assert (scheme.method, scheme.group_size, scheme.desc_act, scheme.symmetric) == expected
    assert re.search(reason, scheme.reason), scheme.reason
    record = scheme.to_json()
    assert record["requested"]["method"] == quant.get("method", "auto") and record["method"] == scheme.method
    qconfig = _qconfig(scheme.method, scheme.group_size, min(dims.values()), desc_act=scheme.desc_act,
                       sym=scheme.symmetric)
    assert serving_engine(qconfig) == engine


def test_auto_refuses_a_model_no_auto_group_divides() -> None:
    with pytest.raises(ConfigError, match=r"none of 128, 64, 32 divides q \(in_features 48\).*--group-size"):
        resolve_scheme(LLMQuantConfig(), {"q": 48})
