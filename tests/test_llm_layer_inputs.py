"""Each decoder layer is walked with its own attention inputs (issue 57, item 1).

transformers builds the rotary tables and the attention mask per layer type (``position_embeddings[layer_type]``,
``causal_mask_mapping[layer_type]``); the engine's walk (``catch_layer_inputs`` then ``advance``) must feed every
layer what the model's own forward feeds it. The reference is the model itself: with quantization off, the walk
reproduces ``output_hidden_states`` at every layer. The families cover uniform layers (Llama, Mistral, Phi-3) and
mixed ones (Qwen2 with ``layer_types``, Gemma 2, Gemma 3 with a local and a global RoPE base); every sliding window
is shorter than the sequence, so a sliding layer fed a full mask (or the reverse) differs.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import tiny_llama
import torch

from calibrators.groupwise.gptq import HessianAccumulator
from calibrators.groupwise.rtn import output_error
from deploy_opt.llm.checks import PerplexityWindow, perplexity
from deploy_opt.llm.layer_walk import advance, catch_layer_inputs, decoder_layers
from deploy_opt.llm.onload import layer_source, load_skeleton, open_folder, streamed_perplexity
from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model
from dopt_common.errors import ModelError

transformers = pytest.importorskip("transformers")

SEQ, WINDOW = 24, 6
TEXT = " ".join(f"def f{i}(x): return x * {i} + {i % 7}" for i in range(100))
SLIDING, FULL = "sliding_attention", "full_attention"
SMALL = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
}


def _config(family: str, vocab: int = 128):
    """A tiny random config of ``family``, 3 to 5 layers, hidden 64."""
    small = {**SMALL, "vocab_size": vocab}
    if family == "llama":
        return transformers.LlamaConfig(num_hidden_layers=4, **small)
    if family == "qwen2":
        return transformers.Qwen2Config(
            num_hidden_layers=4,
            use_sliding_window=True,
            sliding_window=WINDOW,
            layer_types=[FULL, SLIDING, SLIDING, FULL],
            **small,
        )
    if family == "mistral":
        return transformers.MistralConfig(num_hidden_layers=3, sliding_window=WINDOW, **small)
    if family == "gemma2":
        return transformers.Gemma2Config(num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=16, **small)
    if family == "gemma3":
        rope = {
            SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
            FULL: {"rope_type": "default", "rope_theta": 1_000_000.0},
        }
        return transformers.Gemma3TextConfig(
            num_hidden_layers=5,
            sliding_window=WINDOW,
            layer_types=[SLIDING, SLIDING, FULL, SLIDING, FULL],
            rope_parameters=rope,
            query_pre_attn_scalar=16,
            **small,
        )
    if family == "phi3":
        return transformers.Phi3Config(num_hidden_layers=3, pad_token_id=0, eos_token_id=2, **small)
    raise ValueError(family)


FAMILIES = ("llama", "qwen2", "mistral", "gemma2", "gemma3", "phi3")


def _model(family: str, vocab: int = 128) -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(family, vocab), dtype=torch.float32).eval()
    with torch.no_grad():  # random norms (Gemma's are 1 + w with w = 0 at init) so every weight matters
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_the_walk_reproduces_every_hidden_state_of_the_model(family: str) -> None:
    model = _model(family)
    samples = [torch.randint(3, 128, (1, SEQ), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    layers = decoder_layers(model)
    inputs = catch_layer_inputs(model, samples)
    walked = [[hidden] for hidden in inputs.hidden]  # per sample, the input of each layer, then the last output
    for index, layer in enumerate(layers):
        advance(layer, index, inputs)
        for states, hidden in zip(walked, inputs.hidden, strict=True):
            states.append(hidden)
    for sample, states in zip(samples, walked, strict=True):
        reference = model(input_ids=sample, output_hidden_states=True, use_cache=False).hidden_states
        assert len(reference) == len(layers) + 1
        states[-1] = model.model.norm(states[-1])  # transformers ties the last hidden state to the normed output
        errors = [_relative(mine, theirs) for mine, theirs in zip(states, reference, strict=True)]
        assert max(errors) < 1e-5, f"{family}: relative error per layer {errors}"


def test_layers_of_one_type_share_their_kwargs() -> None:
    """The caught kwargs are the model's own objects (no copies): memory stays one set per layer type."""
    model = _model("gemma3")
    inputs = catch_layer_inputs(model, [torch.randint(3, 128, (1, SEQ))])
    [per_layer] = inputs.kwargs
    kinds = model.config.layer_types
    same = per_layer[0]["position_embeddings"][0] is per_layer[1]["position_embeddings"][0]
    other = per_layer[0]["position_embeddings"][0] is per_layer[2]["position_embeddings"][0]
    assert kinds[0] == kinds[1] != kinds[2] and same and not other


def test_catching_never_touches_the_layers_weights() -> None:
    """Layers on the meta device (``--onload layers``) are stubbed, never run."""
    model = _model("gemma3")
    sample = torch.randint(3, 128, (1, SEQ))
    expected = catch_layer_inputs(model, [sample])
    for layer in decoder_layers(model):
        layer.to_empty(device="meta")
    caught = catch_layer_inputs(model, [sample])
    assert torch.equal(caught.hidden[0], expected.hidden[0])
    assert len(caught.kwargs[0]) == len(decoder_layers(model))
    assert all(type(layer).forward is layer.forward.__func__ for layer in decoder_layers(model))  # stubs removed


class _ToyLayer(torch.nn.Module):
    def __init__(self, as_tuple: bool) -> None:
        super().__init__()
        self.linear, self.as_tuple = torch.nn.Linear(4, 4), as_tuple

    def forward(self, hidden: torch.Tensor, scale: float) -> torch.Tensor | tuple:
        out = torch.tanh(self.linear(hidden)) * scale
        return (out,) if self.as_tuple else out


class _ToyDecoder(torch.nn.Module):
    """A decoder whose loop gives each layer its own ``scale``; ``loop``: how it hands a layer's output on."""

    def __init__(self, loop: str) -> None:
        super().__init__()
        self.loop, self.embed, self.model = loop, torch.nn.Embedding(10, 4), torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(_ToyLayer(loop == "tuple") for _ in range(3))

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embed

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for index, layer in enumerate(self.model.layers):
            out = layer(hidden, scale=float(index + 1))
            hidden = out[0] if self.loop == "tuple" else out  # Llama 4 and Falcon-H1 take a tuple's first item
            if self.loop == "meddling":
                hidden = hidden + 1
        return hidden


@pytest.mark.parametrize("loop", ["tensor", "tuple"])
@torch.no_grad()
def test_stubs_return_what_the_decoder_loop_expects(loop: str) -> None:
    torch.manual_seed(0)
    model, ids = _ToyDecoder(loop), torch.randint(0, 10, (1, 5))
    inputs = catch_layer_inputs(model, [ids])
    assert [kwargs["scale"] for kwargs in inputs.kwargs[0]] == [1.0, 2.0, 3.0]
    for index, layer in enumerate(model.model.layers):
        advance(layer, index, inputs)
    assert torch.equal(inputs.hidden[0], model(ids))


def test_a_loop_that_changes_the_hidden_states_between_layers_is_refused() -> None:
    with pytest.raises(ModelError, match="changes the hidden states between decoder layers"):
        catch_layer_inputs(_ToyDecoder("meddling"), [torch.randint(0, 10, (1, 5))])


def _inputs_seen(model: torch.nn.Module, names: list[str], samples: list[torch.Tensor]) -> dict:
    """Each named Linear's input statistics over ``samples`` run through the whole model (the reference)."""
    stats = {name: HessianAccumulator(model.get_submodule(name).in_features) for name in names}
    hooks = [
        model.get_submodule(name).register_forward_hook(lambda module, args, out, name=name: stats[name].add(args[0]))
        for name in names
    ]
    with torch.no_grad():
        for sample in samples:
            model(input_ids=sample, use_cache=False)
    for hook in hooks:
        hook.remove()
    return stats


def test_gptq_on_gemma3_calibrates_every_layer_on_what_the_quantized_model_feeds_it() -> None:
    """GPTQ end to end on Gemma 3; each layer's q/k/v were calibrated on the inputs the quantized model gives them.

    A layer's q/k/v read its input through its input norm, and that input is what the quantized layers before it
    produce: the Hessian the engine used is the one the finished model's own forward gives. So the recorded output
    error of every q/k/v equals the one recomputed from hooks on the quantized model (with the wrong rotary or mask
    on the full-attention layers, the layers from the first one on differ)."""
    base = _model("gemma3")
    model = copy.deepcopy(base)
    samples = [torch.randint(3, 128, (1, SEQ), generator=torch.Generator().manual_seed(s)) for s in range(16)]
    result = quantize_model(model, samples, EngineSettings(method="gptq", group_size=16), progress=False)
    assert len(result.records) == 5 * 7 and set(result.weights) == {r.name for r in result.records}
    records = {r.name: r for r in result.records}
    for name, record in records.items():
        assert torch.equal(model.get_submodule(name).weight, result.weights[name].dequantize())
        assert 0 < record.weight_error < 0.3 and 0 < record.output_error < 0.1
    qkv = [name for name in records if name.endswith(("q_proj", "k_proj", "v_proj"))]
    seen = _inputs_seen(model, qkv, samples)
    for name in qkv:
        reference, approx = base.get_submodule(name).weight.detach(), model.get_submodule(name).weight.detach()
        recomputed = output_error(reference, approx, seen[name].hessian())
        assert records[name].output_error == pytest.approx(recomputed, rel=1e-4), name
    held_out = torch.randint(3, 128, (4, SEQ), generator=torch.Generator().manual_seed(99))
    rtn = copy.deepcopy(base)
    quantize_model(rtn, samples, EngineSettings(method="rtn", group_size=16), progress=False)
    with torch.no_grad():
        logits = {m: net(input_ids=held_out).logits for m, net in (("base", base), ("gptq", model), ("rtn", rtn))}
    assert _relative(logits["gptq"], logits["base"]) < _relative(logits["rtn"], logits["base"])


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_llama.train_tokenizer()


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_layers_onloaded_one_at_a_time_walk_as_the_model_runs(family: str, tokenizer, tmp_path: Path) -> None:
    """``--onload layers``: the skeleton's layers sit on the meta device; perplexity and GPTQ match the in-memory
    model's, windows longer than the sliding window."""
    model = _model(family, vocab=len(tokenizer))
    model.save_pretrained(tmp_path)
    folder = open_folder(tmp_path)
    skeleton = load_skeleton(folder)
    window = PerplexityWindow(max_seq_len=32, max_tokens=160)
    expected = perplexity(model, tokenizer, TEXT, window)["ppl"]
    assert streamed_perplexity(skeleton, layer_source(folder, skeleton), tokenizer, TEXT, window)["ppl"] == (
        pytest.approx(expected, rel=1e-5)
    )
    samples = [torch.randint(3, len(tokenizer), (1, SEQ), generator=torch.Generator().manual_seed(s)) for s in range(4)]
    settings = EngineSettings(method="gptq", group_size=16)
    streamed = quantize_model(skeleton, samples, settings, progress=False, source=layer_source(folder, skeleton))
    in_memory = quantize_model(model, samples, settings, progress=False)
    assert [r.output_error for r in streamed.records] == pytest.approx([r.output_error for r in in_memory.records])
