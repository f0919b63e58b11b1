"""Every decoder family of the architecture table that lmdeploy 0.18 serves, quantized and read back by lmdeploy.

Issue 55, item 2. For each family (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma 2, Gemma 3) a tiny random
model built here (hidden 128, head_dim 32, two layers; GQA with 4 query and 2 key/value heads) is quantized by our
engine with AWQ, AWQ + GPTQ (what method auto writes) and GPTQ with act-order and static groups, asymmetric, each
at group 64 in the AWQ layout; with AWQ once more without GQA (4 key/value heads, so v_proj → o_proj folds too);
and, for the families in TurboMind's list (Llama, Qwen2, Qwen3), with symmetric GPTQ at group 128 in the GPTQ
layout. Each checkpoint is read back by lmdeploy 0.18's own reader for it (``tests/lmdeploy_source.py``): the
PyTorch engine's ``AwqLinear`` + ``dequantize_gemm`` for the AWQ layout, TurboMind's weight formats for GPTQ.

The layer norms carry four outlier channels (gain 8), as trained LLMs do, so AWQ's search picks scales far from
1 and a wrong fold shows. Gemma 3 is tested twice: as Gemma3ForCausalLM and as Gemma3ForConditionalGeneration (the
language model of 4B and up, beside a vision tower, which stays float). Nemotron (no lmdeploy engine: its GGUF
route is tested elsewhere) and Qwen3-Next (refused) are named with their reasons (``NOT_HERE``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from lmdeploy_source import checkpoint_tensors, cpu_tensors, lmdeploy_readers, pytorch_engine_weight, turbomind_weight

from deploy_opt.llm import awq_layer
from deploy_opt.llm.architectures import ARCHITECTURES, by_layer
from deploy_opt.llm.layer_walk import decoder_layers
from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model, target_linears
from exporters.lmdeploy_engines import TURBOMIND_ARCHITECTURES
from exporters.w4a16_writer import write_quantized_checkpoint

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.lmdeploy, pytest.mark.usefixtures("one_thread")]

ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
LLAMA_FOLDS = ("input_layernorm", "post_attention_layernorm", "mlp.up_proj")
GEMMA2_FOLDS = ("input_layernorm", "pre_feedforward_layernorm", "mlp.up_proj")  # behind the sandwich norm
SLIDING, FULL = "sliding_attention", "full_attention"
LAYERS, HEADS, GROUP, OUTLIER_GAIN = 2, 4, 64, 8.0
# Relative logit error between the read-back model and ours: every tensor is stored as fp16 (a relative rounding
# of at most 2**-11 ≈ 4.9e-4 each, on the scales, the dequantized weights, the norms and embeddings), which
# compounds over two layers to ~1e-3 (measured 2.7e-4 to 1.2e-3); a misread layout or group is off by O(1).
READ_BACK_RTOL = 5e-3
# Replaying the engine's folds on the float model: float32 reassociation only (measured below 1e-6); folding the
# same scales with the other norm form changes the logits by 4e-2 to 5e-1 on these models.
FOLD_RTOL, WRONG_FOLD_MIN = 1e-5, 1e-2
# Our logit error over round-to-nearest's at the same group and symmetry: AWQ and GPTQ lower each layer's output
# error, which RTN ignores (measured 0.51 to 1.01); a zero point off by one, or groups dealt to the wrong
# columns, measure 5x to 15x RTN's.
RTN_RATIO_MAX = 1.25


@dataclass(frozen=True)
class Family:
    """A family's Hugging Face class, every Linear of its decoder layer and the producers AWQ folds into."""

    architecture: str
    linears: tuple[str, ...]
    folds: tuple[str, ...]  # with GQA, where v_proj's rows do not line up with o_proj's columns
    one_plus_w: bool = False  # GemmaRMSNorm: the module multiplies by 1 + weight

    def folds_without_gqa(self) -> tuple[str, ...]:
        """The producers AWQ folds into when every query head has its own value head."""
        return self.folds + ("self_attn.v_proj",) if "self_attn.v_proj" in self.linears else self.folds


FAMILIES = {
    "llama": Family("LlamaForCausalLM", ATTENTION + MLP, LLAMA_FOLDS),
    "mistral": Family("MistralForCausalLM", ATTENTION + MLP, LLAMA_FOLDS),
    "qwen2": Family("Qwen2ForCausalLM", ATTENTION + MLP, LLAMA_FOLDS),
    "qwen3": Family("Qwen3ForCausalLM", ATTENTION + MLP, LLAMA_FOLDS),
    "phi3": Family(  # fused qkv_proj and gate_up_proj: only the norms fold
        "Phi3ForCausalLM",
        ("self_attn.o_proj", "self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"),
        ("input_layernorm", "post_attention_layernorm"),
    ),
    "gemma": Family("GemmaForCausalLM", ATTENTION + MLP, LLAMA_FOLDS, one_plus_w=True),
    "gemma2": Family("Gemma2ForCausalLM", ATTENTION + MLP, GEMMA2_FOLDS, one_plus_w=True),
    "gemma3": Family("Gemma3ForCausalLM", ATTENTION + MLP, GEMMA2_FOLDS, one_plus_w=True),
    # Gemma 3 of 4B and up: the language model beside a vision tower (model.model.language_model.layers)
    "gemma3-vl": Family("Gemma3ForConditionalGeneration", ATTENTION + MLP, GEMMA2_FOLDS, one_plus_w=True),
}
NOT_HERE = {
    "NemotronForCausalLM": "lmdeploy runs it on no engine: tests/test_llm_gguf_nemotron.py reads its GGUF back",
    "Qwen3NextForCausalLM": "quantize-llm refuses it: its MoE experts are fused 3-D parameters, not Linears",
}


@dataclass(frozen=True)
class Method:
    """One way to quantize and write: the engine's settings, the checkpoint layout and the key/value heads."""

    settings: EngineSettings
    fmt: str = "awq"
    kv_heads: int = 2  # of HEADS query heads


METHODS = {
    "awq": Method(EngineSettings(method="awq", group_size=GROUP)),
    "awq-gptq": Method(EngineSettings(method="awq-gptq", group_size=GROUP)),
    "gptq-static": Method(
        EngineSettings(method="gptq", group_size=GROUP, desc_act=True, static_groups=True, sym=False)
    ),
    "awq-mha": Method(EngineSettings(method="awq", group_size=GROUP), kv_heads=HEADS),
    "gptq-turbomind": Method(EngineSettings(method="gptq", group_size=128, desc_act=False, sym=True), fmt="gptq"),
}
CASES = [
    (family, method)
    for family, spec in FAMILIES.items()
    for method in METHODS
    if method != "gptq-turbomind" or spec.architecture in TURBOMIND_ARCHITECTURES
]


def _config(family: str, kv_heads: int):
    """A tiny config of ``family``: in_features 128 or 256, so group 64 and 128 divide every Linear."""
    small = {
        "vocab_size": 256,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": kv_heads,
        "head_dim": 32,
        "max_position_embeddings": 128,
    }
    if family == "phi3":  # head_dim is hidden / heads
        return transformers.Phi3Config(
            pad_token_id=0, eos_token_id=2, **{k: v for k, v in small.items() if k != "head_dim"}
        )
    if family == "gemma2":
        return transformers.Gemma2Config(sliding_window=16, query_pre_attn_scalar=32, **small)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            sliding_window=16, layer_types=[SLIDING, FULL], query_pre_attn_scalar=32, **small
        )
    if family == "gemma3-vl":  # a one-layer SigLIP beside the language model; only the latter is quantized
        text = transformers.Gemma3TextConfig(
            sliding_window=16, layer_types=[SLIDING, FULL], query_pre_attn_scalar=32, **small
        )
        vision = transformers.SiglipVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        )
        return transformers.Gemma3Config(
            text_config=text,
            vision_config=vision,
            mm_tokens_per_image=4,
            image_token_index=255,
            boi_token_index=253,
            eoi_token_index=254,
        )
    configs = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma": transformers.GemmaConfig,
    }
    return configs[family](**small)


def _model(family: str, kv_heads: int) -> torch.nn.Module:
    """A random float32 model whose norms have random gains (the layer norms four outlier channels each) and whose
    biases (Qwen2's q/k/v) are random, not transformers' zeros."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(family, kv_heads), dtype=torch.float32).eval()
    offset = 1.0 if FAMILIES[family].one_plus_w else 0.0
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            if "norm" not in name:
                continue
            gain = 1 + 0.1 * torch.randn(param.shape, generator=gen)
            if name.endswith("layernorm.weight"):
                gain[torch.randperm(param.numel(), generator=gen)[:4]] *= OUTLIER_GAIN
            param.copy_(gain - offset)
    return model


@pytest.fixture(scope="module")
def lmd():
    """lmdeploy 0.18's reader functions, imported from its files with the package stand-ins."""
    with lmdeploy_readers() as readers:
        yield readers


@dataclass(frozen=True)
class Quantized:
    """One family quantized one way: the float model, ours (fake-quantized), its codes, folder and AWQ folds."""

    family: str
    method: Method
    float_model: torch.nn.Module
    model: torch.nn.Module
    weights: dict
    folder: Path
    folds: list  # (layer index, ScaleGroup, scales, norm form), in the order the engine folded them


def _quantize(family: str, method: Method, folder: Path) -> Quantized:
    """Quantize ``family``'s model with ``method`` and write it, recording every fold AWQ makes."""
    float_model = _model(family, method.kv_heads)
    model = copy.deepcopy(float_model)
    index = {id(layer): i for i, layer in enumerate(decoder_layers(model))}
    folds, fold_scales = [], awq_layer.fold_scales

    def record(layer, group, scales, form="w"):
        folds.append((index[id(layer)], group, scales.clone(), form))
        fold_scales(layer, group, scales, form)

    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, 256, (1, 48), generator=gen) for _ in range(8)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(awq_layer, "fold_scales", record)
        result = quantize_model(model, samples, method.settings, progress=False)
    write_quantized_checkpoint(model, result.weights, folder, fmt=method.fmt)
    return Quantized(family, method, float_model, model, dict(result.weights), folder, folds)


@pytest.fixture(scope="module", params=CASES, ids=[f"{family}-{method}" for family, method in CASES])
def quantized(request, tmp_path_factory: pytest.TempPathFactory) -> Quantized:
    family, method = request.param
    return _quantize(family, METHODS[method], tmp_path_factory.mktemp(f"{family}-{method}") / "checkpoint")


TOKENS = torch.randint(3, 256, (3, 32), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _logits(model: torch.nn.Module) -> torch.Tensor:
    return model(TOKENS).logits


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _expected_fp16(qw) -> torch.Tensor:
    """Our codes times the fp16 scales the file holds, rounded to fp16 as both readers do: [in, out]."""
    g = qw.g_idx.long()
    return ((qw.qweight.float() - qw.zeros.float()[g].t()) * qw.scales.half().float()[g].t()).t().half()


# ---------- the table ----------


def test_every_family_of_the_table_is_here_or_named_with_a_reason() -> None:
    table = {name for arch in ARCHITECTURES for name in arch.hf_architectures}
    assert table == {spec.architecture for spec in FAMILIES.values()} | set(NOT_HERE)
    for family, spec in FAMILIES.items():  # each model's decoder layer finds its own entry (no Llama fallback)
        layer = decoder_layers(transformers.AutoModelForCausalLM.from_config(_config(family, 2)))[0]
        arch = by_layer(type(layer).__name__)
        assert arch is not None and spec.architecture in arch.hf_architectures, family
        assert (arch.norm_form == "1 + w") == spec.one_plus_w, family


# ---------- every Linear quantized and written ----------


def test_every_linear_of_the_family_is_quantized_and_written(quantized: Quantized) -> None:
    from safetensors import safe_open

    model, spec = quantized.model, FAMILIES[quantized.family]
    layers = decoder_layers(model)
    prefix = next(name for name, module in model.named_modules() if module is layers)
    assert prefix == ("model.language_model.layers" if quantized.family == "gemma3-vl" else "model.layers")
    expected = {f"{prefix}.{i}.{local}" for i in range(LAYERS) for local in spec.linears}
    linears = {name for name, m in layers.named_modules() if isinstance(m, torch.nn.Linear)}
    assert {f"{prefix}.{name}" for name in linears} == expected  # the family has no other Linear
    assert set(target_linears(model, ("embed_tokens", "lm_head"))) == expected == set(quantized.weights)
    with safe_open(str(quantized.folder / "model.safetensors"), "pt") as file:
        keys = set(file.keys())
    suffixes = ("qweight", "qzeros", "scales") + (("g_idx",) if quantized.method.fmt == "gptq" else ())
    assert {f"{name}.{suffix}" for name in expected for suffix in suffixes} <= keys
    kept = {key for key in model.state_dict() if key[: -len(".weight")] not in expected}
    if model.config.tie_word_embeddings:
        kept.discard("lm_head.weight")  # one copy of a tied tensor, as from_pretrained expects
    assert keys == kept | {f"{name}.{suffix}" for name in expected for suffix in suffixes}


# ---------- read back by lmdeploy ----------


PACKED = (".qweight", ".qzeros", ".scales", ".g_idx")  # a quantized Linear's tensors; everything else is float


def _read_back(lmd, quantized: Quantized) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(Linear name → lmdeploy's dequantized weight [in, out], every other tensor) as the engine that serves the
    layout reads them: TurboMind for GPTQ, the PyTorch engine for AWQ."""
    folder, group = quantized.folder, quantized.method.settings.group_size
    if quantized.method.fmt == "gptq":
        with cpu_tensors():
            checkpoint = lmd.checkpoint.create_checkpoint(str(folder))
            linears = {name: turbomind_weight(lmd, folder, name, "gptq", group) for name in quantized.weights}
            rest = {key: checkpoint.get(key) for key in checkpoint.keys() if not key.endswith(PACKED)}
    else:
        config = lmd.config.QuantizationConfig.from_config(transformers.AutoConfig.from_pretrained(folder))
        assert (config.quant_method, config.bits, config.group_size) == ("awq", 4, group)
        tensors = checkpoint_tensors(lmd, folder)
        linears = {
            name: pytorch_engine_weight(lmd, tensors, name, qw.shape, group) for name, qw in quantized.weights.items()
        }
        rest = {key: t for key, t in tensors.items() if not key.endswith(PACKED)}
    return linears, rest


def _model_from(folder: Path, linears: dict[str, torch.Tensor], rest: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A fresh float32 model of the folder's config holding lmdeploy's tensors (lm_head re-tied where tied)."""
    config = transformers.AutoConfig.from_pretrained(folder)
    del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    state = {key: t.float() for key, t in rest.items()}
    state.update({f"{name}.weight": weight.t().float() for name, weight in linears.items()})
    result = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert set(result.missing_keys) == tied and not result.unexpected_keys
    if tied:
        model.tie_weights()
    return model


def test_lmdeploy_reads_back_the_model_we_quantized(lmd, quantized: Quantized) -> None:
    linears, rest = _read_back(lmd, quantized)
    for name, qw in quantized.weights.items():  # each Linear: our codes and fp16 scales, bit for bit
        assert torch.equal(linears[name], _expected_fp16(qw)), name
    ours = quantized.model.state_dict()
    for key, tensor in rest.items():  # norms (AWQ-folded), biases, embeddings, lm_head: our fp16 values
        assert torch.equal(tensor, ours[key].half()), key
    read_back = _model_from(quantized.folder, linears, rest)
    error = _relative(_logits(read_back), _logits(quantized.model))
    assert error < READ_BACK_RTOL, f"{quantized.family}: read-back logits differ from ours by {error:.2e}"


def test_the_quantized_model_stays_within_rtn_s_error(quantized: Quantized) -> None:
    settings = quantized.method.settings
    rtn = copy.deepcopy(quantized.float_model)
    samples = [torch.randint(3, 256, (1, 48), generator=torch.Generator().manual_seed(0))]
    rtn_settings = EngineSettings(method="rtn", group_size=settings.group_size, sym=settings.symmetric)
    quantize_model(rtn, samples, rtn_settings, progress=False)
    reference = _logits(quantized.float_model)
    ours, baseline = _relative(_logits(quantized.model), reference), _relative(_logits(rtn), reference)
    assert ours < RTN_RATIO_MAX * baseline, f"{quantized.family}: logit error {ours:.3f}, RTN's {baseline:.3f}"


# ---------- AWQ's folds keep each family's float function ----------


def _replay(quantized: Quantized, swap_form: bool = False) -> torch.nn.Module:
    """The float model with the engine's recorded folds applied (no rounding); ``swap_form``: each norm folded
    as the other form (``w`` for ``1 + w`` and back), a wrong fold."""
    model = copy.deepcopy(quantized.float_model)
    with torch.no_grad():
        for index, group, scales, form in quantized.folds:
            if swap_form:
                form = "w" if form == "1 + w" else "1 + w"
            awq_layer.fold_scales(decoder_layers(model)[index], group, scales, form)
    return model


def test_awq_folds_keep_the_family_s_float_function(quantized: Quantized) -> None:
    spec, method = FAMILIES[quantized.family], quantized.method
    if not method.settings.method.startswith("awq"):  # GPTQ scales nothing: the norms stay as they were
        assert not quantized.folds
        for name, param in quantized.float_model.named_parameters():
            if "norm" in name:
                assert torch.equal(quantized.model.get_parameter(name), param), name
        return
    producers = spec.folds if method.kv_heads < HEADS else spec.folds_without_gqa()
    assert sorted((i, g.producer) for i, g, _, _ in quantized.folds) == [
        (i, p) for i in range(LAYERS) for p in sorted(producers)
    ]
    # Scales away from 1 (measured 0.13 to 0.6 in |log s|, 0.035 for one v_proj), so a mishandled channel moves
    # the logits far beyond FOLD_RTOL.
    assert all(float(s.log().abs().max()) > 0.02 for _, _, s, _ in quantized.folds)
    assert {form for *_, form in quantized.folds} == {"1 + w" if spec.one_plus_w else "w"}
    folded = _replay(quantized)
    for name, param in folded.named_parameters():  # the model holds exactly these folded norms
        if "norm" in name:
            assert torch.equal(quantized.model.get_parameter(name), param), name
    reference = _logits(quantized.float_model)
    error = _relative(_logits(folded), reference)
    assert error < FOLD_RTOL, f"{quantized.family}: folding AWQ's scales changed the float logits by {error:.2e}"
    wrong = _relative(_logits(_replay(quantized, swap_form=True)), reference)
    assert wrong > WRONG_FOLD_MIN, f"{quantized.family}: a wrong norm form changed the logits by only {wrong:.2e}"
