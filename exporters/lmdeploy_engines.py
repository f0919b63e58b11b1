"""Which lmdeploy 0.18 engine serves which checkpoint and model class: TurboMind and the PyTorch engine's rules,
each from lmdeploy's own source (cited per rule; ``tests/test_lmdeploy_readers.py`` runs them). No torch here:
``quantize-llm``'s first-second checks (``deploy_opt/llm/preflight.py``) and ``serve`` read these without loading
any weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# lmdeploy 0.18's rules, from its own source (cited per rule; tests/test_lmdeploy_readers.py runs them):
# - TurboMind, ``turbomind/converter.py``: ``get_tm_config`` asserts awq ``version == 'gemm'`` and gptq
#   ``not desc_act and sym``; ``_validate_quant_group_size`` allows group 128 only for awq and gptq
#   (``_SUPPORTED_GROUP_SIZES``). Its readers ignore ``g_idx`` (``GPTQFormat.suffix_map`` has none).
# - PyTorch engine, ``pytorch/config.py``: ``QuantizationConfig.from_config`` reads awq, smooth_quant, fp8 and
#   compressed-tensors and raises "Unsupported quant method" for anything else, gptq included.
#   ``pytorch/nn/linear/awq.py`` (``AwqLinear.create_weights``) needs in_features % group_size == 0 and
#   out_features % 8 == 0; its CUDA kernel (``pytorch/kernels/cuda/awq_kernels.py``: ``awq_linear``) tiles K by
#   the group size, and Triton's ``tl.dot`` needs K >= 16.
# - Architecture, ``turbomind/supported_models.py``: ``SUPPORTED_ARCHS``. The CLI's ``serve api_server`` calls
#   ``archs.autoget_backend`` for every backend but pytorch (``cli/serve.py``), so an architecture outside this list
#   goes to the PyTorch engine even with ``--backend turbomind``; Mistral, Phi-3 and Gemma are not in it.
# - PyTorch engine's architectures, ``pytorch/models/module_map.py``: ``MODULE_MAP``'s keys; ``pytorch/config.py``
#   raises for a model class outside it. An architecture in neither list runs on no engine (Nemotron).
ENGINES = ("turbomind", "pytorch")
TURBOMIND_ARCHITECTURES = (
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
    "InternVLChatModel",
    "InternVLForConditionalGeneration",
    "InternS1ForConditionalGeneration",
    "LlamaForCausalLM",
    "InternLM2ForCausalLM",
    "InternLM3ForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "GptOssForCausalLM",
    "MixtralForCausalLM",
)
PYTORCH_ARCHITECTURES = (
    "ChatGLMForConditionalGeneration",
    "CogVLMForCausalLM",
    "DFlashDraftModel",
    "DeepseekForCausalLM",
    "DeepseekMTPModel",
    "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV32MTPModel",
    "DeepseekV3ForCausalLM",
    "DeepseekV4ForCausalLM",
    "DeepseekVLV2ForCausalLM",
    "Eagle3DeepseekV2ForCausalLM",
    "Eagle3LlamaForCausalLM",
    "EagleLlamaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "GemmaForCausalLM",
    "Glm4ForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "Glm4MoeMTPModel",
    "Glm4vForConditionalGeneration",
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaMTPModel",
    "GptOssForCausalLM",
    "HYV3ForCausalLM",
    "HYV3MTP",
    "InternLM2ForCausalLM",
    "InternLM2ForRewardModel",
    "InternLM3ForCausalLM",
    "InternS1ForConditionalGeneration",
    "InternS1ProForConditionalGeneration",
    "InternS1_1_ForConditionalGeneration",
    "InternS2MobiusForCausalLM",
    "InternS2MobiusForConditionalGeneration",
    "InternS2PreviewForCausalLM",
    "InternS2PreviewForConditionalGeneration",
    "InternVLChatModel",
    "InternVLForConditionalGeneration",
    "KimiK25ForConditionalGeneration",
    "Kimi_K25ForConditionalGeneration",
    "Llama4ForConditionalGeneration",
    "LlamaForCausalLM",
    "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration",
    "MetaMoeForConditionalGeneration",
    "MiniCPM3ForCausalLM",
    "MiniCPMV",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Phi3ForCausalLM",
    "Phi3VForCausalLM",
    "PhiMoEForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2ForRewardModel",
    "Qwen2MoeForCausalLM",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3OmniMoeForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MTPModel",
    "Qwen3_5MoeForConditionalGeneration",
    "SDARForCausalLM",
    "SDARMoeForCausalLM",
)
TURBOMIND_METHODS = ("awq", "gptq")  # of the ones deploy_opt writes; it also reads compressed-tensors, fp8, mxfp4
TURBOMIND_GROUP_SIZE = 128
PYTORCH_AWQ_MIN_GROUP = 16


def architecture_of(config: Mapping[str, Any]) -> str | None:
    """The model class a config.json names (``architectures[0]``), as lmdeploy's ``get_model_arch`` reads it."""
    names = config.get("architectures") or ()
    return str(names[0]) if names else None


def turbomind_problems(qconfig: Mapping[str, Any], architecture: str | None = None) -> list[str]:
    """Why lmdeploy 0.18's TurboMind would refuse this checkpoint (empty: it serves it); ``architecture``: its
    config.json's ``architectures[0]`` (None: not judged)."""
    if architecture is not None and architecture not in TURBOMIND_ARCHITECTURES:
        return [
            f"architecture {architecture} is not in TurboMind's list (turbomind/supported_models.py), so "
            "lmdeploy's CLI sends it to the PyTorch engine whatever --backend says"
        ]
    if not qconfig:
        return []
    method = qconfig.get("quant_method")
    if method not in TURBOMIND_METHODS:
        return [f"quant_method {method!r}: deploy_opt routes only awq and gptq checkpoints to TurboMind"]
    problems = []
    if int(qconfig.get("bits", 4)) != 4:
        problems.append(f"bits {qconfig.get('bits')}: TurboMind reads 4-bit awq/gptq only")
    if qconfig.get("group_size") != TURBOMIND_GROUP_SIZE:
        problems.append(f"group_size {qconfig.get('group_size')}: TurboMind serves {method} at group 128 only")
    if method == "awq" and qconfig.get("version") != "gemm":
        problems.append(f"version {qconfig.get('version')!r}: TurboMind reads AWQ GEMM only")
    if method == "gptq" and qconfig.get("desc_act", False):
        problems.append("desc_act true: TurboMind refuses act-order GPTQ")
    if method == "gptq" and not qconfig.get("sym", True):
        problems.append("sym false: TurboMind refuses asymmetric GPTQ")
    return problems


def pytorch_engine_problems(qconfig: Mapping[str, Any], architecture: str | None = None) -> list[str]:
    """Why lmdeploy 0.18's PyTorch engine would refuse this ``quantization_config`` (empty: it serves it);
    ``architecture``: config.json's ``architectures[0]`` (None: not judged)."""
    if architecture is not None and architecture not in PYTORCH_ARCHITECTURES:
        return [f"architecture {architecture} is not in the PyTorch engine's list (pytorch/models/module_map.py)"]
    if not qconfig:
        return []
    method = qconfig.get("quant_method")
    if method != "awq":
        return [f"quant_method {method!r}: the PyTorch engine reads awq but has no {method} (Unsupported quant method)"]
    problems = []
    if int(qconfig.get("bits", 4)) != 4:
        problems.append(f"bits {qconfig.get('bits')}: the PyTorch engine's AWQ kernels are 4-bit")
    group = qconfig.get("group_size")
    if not isinstance(group, int) or group < PYTORCH_AWQ_MIN_GROUP:
        problems.append(f"group_size {group}: the PyTorch engine's AWQ kernel needs a group of 16 or more")
    elif group & (group - 1):
        problems.append(f"group_size {group}: the PyTorch engine's Triton AWQ kernel needs a power of two")
    return problems


def tp_problems(config: Mapping[str, Any], qconfig: Mapping[str, Any], tp: int) -> list[str]:
    """Why ``tp`` GPUs cannot split this checkpoint: heads and widths must divide by ``tp``, and each shard of a
    row-split layer (o_proj, down_proj) must hold whole quantization groups (empty: it splits)."""
    if tp <= 1:
        return []
    problems = []
    keys = ("num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size")
    sizes = {key: config.get(key) for key in keys}
    for key, size in sizes.items():
        if isinstance(size, int) and size % tp:
            problems.append(f"{key} {size} does not divide by --tp {tp}")
    group = qconfig.get("group_size")
    if isinstance(group, int) and group > 0:
        for key in ("hidden_size", "intermediate_size"):
            size = sizes[key]
            if isinstance(size, int) and not size % tp and (size // tp) % group:
                problems.append(f"{key} {size} / --tp {tp} = {size // tp} is not a whole number of {group}-groups")
    return problems


def engine_problems(qconfig: Mapping[str, Any], architecture: str | None = None) -> dict[str, list[str]]:
    """Each lmdeploy engine ('turbomind', 'pytorch') → why it would refuse the checkpoint (empty: it serves it)."""
    return {
        "turbomind": turbomind_problems(qconfig, architecture),
        "pytorch": pytorch_engine_problems(qconfig, architecture),
    }


def served_architecture(architecture: str | None) -> bool:
    """Whether some lmdeploy 0.18 engine runs this model class at all (None: not judged, taken as yes)."""
    return architecture is None or architecture in TURBOMIND_ARCHITECTURES + PYTORCH_ARCHITECTURES


def serving_engine(qconfig: Mapping[str, Any], architecture: str | None = None) -> str | None:
    """The engine ``serve --backend auto`` picks (TurboMind first), or None when neither serves it."""
    problems = engine_problems(qconfig, architecture)
    return next((engine for engine in ENGINES if not problems[engine]), None)


def requantize_advice(qconfig: Mapping[str, Any], architecture: str | None = None) -> str:
    """What to re-quantize with so that an lmdeploy engine serves the checkpoint."""
    if not served_architecture(architecture):
        return (
            f"lmdeploy 0.18 runs {architecture} on neither engine; quantize a GGUF source with --format gguf and "
            "serve it with llama.cpp or Ollama"
        )
    if architecture is not None and architecture not in TURBOMIND_ARCHITECTURES:
        return (
            f"re-quantize with --method awq (lmdeploy serves {architecture} on its PyTorch engine only, which "
            "reads AWQ at group 32/64/128 and has no GPTQ); --method auto picks it"
        )
    if qconfig.get("quant_method") == "gptq" and qconfig.get("group_size") == TURBOMIND_GROUP_SIZE:
        return "re-quantize with --method gptq --group-size 128 --no-desc-act --symmetric (TurboMind), or --method awq"
    return (
        "re-quantize with --method awq (the PyTorch engine serves AWQ at group 32/64/128), or --method gptq "
        "--group-size 128 --no-desc-act where 128 divides every layer (TurboMind); --method auto picks for you"
    )
