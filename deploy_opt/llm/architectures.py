"""The decoder families deploy_opt knows, in one table: GGUF name, norm convention and AWQ's scaling groups.

- **Norm offset** (``norm_offset``): what llama.cpp's ``convert_hf_to_gguf.py`` adds to every ``*norm.weight``
  it writes, so that llama.cpp can run a plain ``x * w`` RMSNorm. Gemma, Gemma 2 and Gemma 3 (``GemmaModel``,
  ``Gemma2Model``, ``Gemma3Model.norm_shift``) and Nemotron (``layernorm1p``) store ``1 + w``; Qwen3-Next does
  too, except ``linear_attn.norm.weight``. transformers' GGUF loader subtracts the 1 again
  (``Gemma2TensorProcessor``, ``NemotronTensorProcessor``). Every other family here stores ``w`` as it is.
- **Norm form** (``norm_form``): how the Hugging Face module applies its weight: ``w`` (Llama's RMSNorm) or
  ``1 + w`` (``GemmaRMSNorm``). Folding a scale ``1/s`` into a ``1 + w`` norm is ``w' = (1 + w) / s - 1``.
- **AWQ's scaling groups** (``awq_groups``): a producer (a norm or a Linear) whose output feeds a set of Linears,
  and nothing between them that is not linear per channel. Llama's MLP reads ``post_attention_layernorm``; Gemma 2
  and 3 put a sandwich norm there (it scales the attention output) and read ``pre_feedforward_layernorm``.
  q/k norms (Qwen3, Gemma 3) renormalise each head of q_proj/k_proj's output: no scale may be folded across them,
  so no group has q_proj or k_proj as its producer.

A family with no AWQ groups (Nemotron's squared-ReLU MLP, Qwen3-Next's linear attention) is refused by AWQ, and
``method: auto`` quantizes it with GPTQ instead (``scheme.py``). Qwen3-Next is in the table for its GGUF norms
only: ``quantize-llm`` refuses it (``not_quantized``).
A layer class not in the table is treated as Llama-style when it has Llama's modules (``awq_layer.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

NORM, LINEAR = "norm", "linear"


@dataclass(frozen=True)
class ScaleGroup:
    """AWQ's group: ``producer`` takes 1/s on its output channels, each Linear in ``consumers`` s on its inputs."""

    producer: str
    kind: str  # NORM or LINEAR
    consumers: tuple[str, ...]


@dataclass(frozen=True)
class Architecture:
    """One decoder family: its Hugging Face and GGUF names, norm convention and AWQ groups."""

    family: str  # the decoder layer's class is f"{family}DecoderLayer"
    hf_architectures: tuple[str, ...]
    gguf_arch: str
    norm_offset: float = 0.0  # added to each ``*norm.weight`` by llama.cpp's converter
    norm_offset_except: tuple[str, ...] = ()  # HF name suffixes the offset skips
    norm_form: str = "w"  # "w" or "1 + w"
    awq_groups: tuple[ScaleGroup, ...] = ()
    qk_norms: tuple[str, ...] = ()
    permute_qk: bool = False  # llama.cpp stores q/k rows in its rotary order (LlamaModel.permute)
    not_quantized: str = ""  # why quantize-llm refuses the family ("": it quantizes it)


ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
LLAMA_GROUPS = (
    ScaleGroup("input_layernorm", NORM, ATTENTION),
    ScaleGroup("self_attn.v_proj", LINEAR, ("self_attn.o_proj",)),
    ScaleGroup("post_attention_layernorm", NORM, ("mlp.gate_proj", "mlp.up_proj")),
    ScaleGroup("mlp.up_proj", LINEAR, ("mlp.down_proj",)),
)
GEMMA2_GROUPS = (
    ScaleGroup("input_layernorm", NORM, ATTENTION),
    ScaleGroup("self_attn.v_proj", LINEAR, ("self_attn.o_proj",)),
    ScaleGroup("pre_feedforward_layernorm", NORM, ("mlp.gate_proj", "mlp.up_proj")),
    ScaleGroup("mlp.up_proj", LINEAR, ("mlp.down_proj",)),
)
PHI3_GROUPS = (  # fused qkv_proj and gate_up_proj: only the norms fold (AutoAWQ's Phi-3 groups)
    ScaleGroup("input_layernorm", NORM, ("self_attn.qkv_proj",)),
    ScaleGroup("post_attention_layernorm", NORM, ("mlp.gate_up_proj",)),
)
QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")

ARCHITECTURES = (
    Architecture("Llama", ("LlamaForCausalLM",), "llama", awq_groups=LLAMA_GROUPS, permute_qk=True),
    Architecture("Mistral", ("MistralForCausalLM",), "llama", awq_groups=LLAMA_GROUPS, permute_qk=True),
    Architecture("Qwen2", ("Qwen2ForCausalLM",), "qwen2", awq_groups=LLAMA_GROUPS),
    Architecture("Qwen3", ("Qwen3ForCausalLM",), "qwen3", awq_groups=LLAMA_GROUPS, qk_norms=QK_NORMS),
    Architecture("Phi3", ("Phi3ForCausalLM",), "phi3", awq_groups=PHI3_GROUPS),
    Architecture("Gemma", ("GemmaForCausalLM",), "gemma", 1.0, norm_form="1 + w", awq_groups=LLAMA_GROUPS),
    Architecture("Gemma2", ("Gemma2ForCausalLM",), "gemma2", 1.0, norm_form="1 + w", awq_groups=GEMMA2_GROUPS),
    Architecture(
        "Gemma3",
        ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
        "gemma3",
        1.0,
        norm_form="1 + w",
        awq_groups=GEMMA2_GROUPS,
        qk_norms=QK_NORMS,
    ),
    Architecture("Nemotron", ("NemotronForCausalLM",), "nemotron", 1.0, norm_form="1 + w"),
    Architecture(
        "Qwen3Next",
        ("Qwen3NextForCausalLM",),
        "qwen3next",
        1.0,
        norm_offset_except=("linear_attn.norm.weight",),
        norm_form="1 + w",
        qk_norms=QK_NORMS,
        not_quantized="its MoE experts are fused 3-D parameters, not Linears, which the W4A16 engine would leave float",
    ),
)


def by_hf_architecture(names: list[str] | tuple[str, ...]) -> Architecture | None:
    """The table's entry for the first of a config's ``architectures`` that it holds, or None."""
    for name in names:
        for arch in ARCHITECTURES:
            if name in arch.hf_architectures:
                return arch
    return None


def by_gguf_arch(gguf_arch: str) -> Architecture | None:
    """The first entry written as ``gguf_arch`` (the norm convention is the GGUF architecture's), or None."""
    return next((arch for arch in ARCHITECTURES if arch.gguf_arch == gguf_arch), None)


def by_layer(class_name: str) -> Architecture | None:
    """The entry whose decoder layer class is ``class_name`` (e.g. ``Gemma3DecoderLayer``), or None."""
    return next((arch for arch in ARCHITECTURES if f"{arch.family}DecoderLayer" == class_name), None)


def norm_offset(gguf_arch: str, hf_name: str) -> float:
    """What llama.cpp's converter adds to the tensor ``hf_name`` of a ``gguf_arch`` model (0.0 for most)."""
    arch = by_gguf_arch(gguf_arch)
    if arch is None or not hf_name.endswith("norm.weight") or hf_name.endswith(arch.norm_offset_except):
        return 0.0
    return arch.norm_offset


def qk_heads(gguf_arch: str, gguf_name: str, heads: tuple[int, int]) -> int | None:
    """The head count llama.cpp permutes the rows of GGUF tensor ``gguf_name`` by in a ``gguf_arch`` model (q:
    ``heads[0]``, k: the kv heads ``heads[1]``; ``permute_qk`` families only), or None where it keeps them."""
    arch = by_gguf_arch(gguf_arch)
    if arch is None or not arch.permute_qk or not gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
        return None
    return heads[0] if "attn_q" in gguf_name else heads[1]
