"""The layer-by-layer walk's inputs: what the model's own forward hands each decoder layer, caught without running one.

transformers builds a decoder layer's keyword arguments per layer type (``position_embeddings[layer_type]``,
``causal_mask_mapping[layer_type]``): with mixed ``layer_types`` (Gemma 2 and 3, Qwen2 or Mistral configs with
sliding windows on some layers) a sliding layer gets a sliding-window mask, and in Gemma 3 a local RoPE base, while
a full-attention layer gets a causal mask and a global base. So the walk cannot reuse layer 0's arguments for every
layer. ``catch_layer_inputs`` runs the model's forward once per sample with each decoder layer's ``forward``
replaced by a stub that records its arguments and passes its hidden states on unchanged; the last stub stops the
forward. No layer computes, so layers on the meta device (``llm/onload.py``) are fine, and neither the final norm
nor the head runs. The recorded arguments are the model's own objects, shared by the layers of one type, not copies.

What a stub returns: in transformers 5.25 the decoder loops of Llama, Qwen2, Mistral, Gemma 2, Gemma 3 and Phi-3
(and most decoders) pass a layer's return value, a tensor, straight to the next layer
(``hidden_states = decoder_layer(...)``); a few (Llama 4, Falcon-H1) take ``layer_outputs[0]`` of a tuple. The
stubs return a tensor and check that the next layer receives that very tensor; where it receives the tensor's
first item instead, the catch starts again with stubs that return ``(hidden,)``. A loop that changes the hidden
states between layers cannot be walked one layer at a time: ModelError.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from dopt_common.errors import ModelError

log = logging.getLogger(__name__)


class _StopForward(Exception):
    """Raised by the last layer's stub: every layer's arguments are caught."""


class _NotHandedOn(Exception):
    """Raised by a stub whose hidden states are not the previous stub's return value."""

    def __init__(self, took_first_item: bool) -> None:
        super().__init__()
        self.took_first_item = took_first_item  # the loop indexed [0] into the tensor: it expects a tuple


def _first_item_of(received: Any, returned: Any) -> bool:
    """True when ``received`` is ``returned[0]`` (a loop that takes a tuple's first item, given a tensor)."""
    return (
        hasattr(received, "data_ptr")
        and received.shape == returned.shape[1:]
        and received.data_ptr() == returned.data_ptr()
        and received.stride() == returned.stride()[1:]
    )


@dataclass
class LayerInputs:
    """The walk's state: each sample's hidden states entering the next layer, and every layer's keyword arguments.

    ``kwargs[sample][layer]`` is what the model's forward passes decoder layer ``layer`` for that sample."""

    hidden: list[Any]
    kwargs: list[list[dict[str, Any]]]

    def of_layer(self, index: int) -> list[tuple[Any, dict[str, Any]]]:
        """(hidden states, keyword arguments) of every sample for decoder layer ``index``."""
        return [(hidden, kwargs[index]) for hidden, kwargs in zip(self.hidden, self.kwargs, strict=True)]


def decoder_layers(model: Any) -> Any:
    """``model.model.layers`` of a Hugging Face decoder model, or ``model.model.language_model.layers`` of one
    that also has a vision tower (Gemma3ForConditionalGeneration: only the language model's layers are walked and
    quantized); else ModelError."""
    from exporters.w4a16_writer import find_decoder_layers

    layers = find_decoder_layers(model)
    if layers is not None:
        return layers
    raise ModelError(
        f"{type(model).__name__} has no model.model.layers (nor model.model.language_model.layers); the LLM engine "
        "supports decoder models such as LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"
    )


def _stub(index: int, count: int, caught: list, as_tuple: bool):
    """A forward for layer ``index`` that appends (hidden, kwargs) to ``caught`` and hands the hidden states on."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 1:
            raise ModelError(
                f"the model passes decoder layer {index} {len(args)} positional arguments; the layer walk supports "
                "loops that pass the hidden states positionally and the rest by keyword (transformers >= 5)"
            )
        hidden = args[0] if args else kwargs.pop("hidden_states")
        if index > 0 and hidden is not caught[-1][0]:
            raise _NotHandedOn(not as_tuple and _first_item_of(hidden, caught[-1][0]))
        caught.append((hidden, kwargs))
        if index == count - 1:
            raise _StopForward
        return (hidden,) if as_tuple else hidden

    return forward


def _catch_one(model: Any, layers: Any, ids: Any, as_tuple: bool) -> list[tuple[Any, dict[str, Any]]]:
    """Every layer's (hidden, kwargs) for one sample, with the stubs installed for this one forward."""
    caught: list[tuple[Any, dict[str, Any]]] = []
    saved = [layer.__dict__.get("forward") for layer in layers]  # an instance forward (accelerate hooks) stays
    for index, layer in enumerate(layers):
        layer.forward = _stub(index, len(layers), caught, as_tuple)
    try:
        model(input_ids=ids, use_cache=False)
    except _StopForward:
        pass
    finally:
        for layer, forward in zip(layers, saved, strict=True):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward
    if len(caught) != len(layers):
        raise ModelError(
            f"{type(model).__name__}'s forward ran {len(caught)} of its {len(layers)} decoder layers; the layer walk "
            "needs a model whose forward runs every layer of model.model.layers in order"
        )
    return caught


def _catch_sample(model: Any, layers: Any, ids: Any, as_tuple: bool | None) -> tuple[list, bool]:
    """``_catch_one`` and whether the stubs returned a tuple; ``as_tuple`` None: a tensor, or a tuple where the
    loop takes the first item of what a layer returns."""
    try:
        return _catch_one(model, layers, ids, bool(as_tuple)), bool(as_tuple)
    except _NotHandedOn as exc:
        if as_tuple is None and exc.took_first_item:
            log.debug("%s's decoder loop takes the first item of a tuple from each layer", type(model).__name__)
            return _catch_sample(model, layers, ids, True)
    raise ModelError(
        f"{type(model).__name__}'s forward changes the hidden states between decoder layers; the layer walk needs "
        "a loop that passes each layer's output (a tensor, or a tuple's first item) straight to the next layer"
    )


def catch_layer_inputs(model: Any, samples: list[Any]) -> LayerInputs:
    """Layer 0's hidden states and every layer's keyword arguments for each sample (on the embeddings' device)."""
    import torch

    layers = decoder_layers(model)
    device = model.get_input_embeddings().weight.device
    inputs = LayerInputs(hidden=[], kwargs=[])
    as_tuple = None
    with torch.no_grad():
        for sample in samples:
            caught, as_tuple = _catch_sample(model, layers, sample.to(device), as_tuple)
            inputs.hidden.append(caught[0][0].detach())
            inputs.kwargs.append([layer_kwargs for _, layer_kwargs in caught])
    return inputs


def advance(layer: Any, index: int, inputs: LayerInputs) -> None:
    """Run decoder layer ``index`` over every sample and replace its hidden states by the output, in place."""
    for position, (hidden, kwargs) in enumerate(inputs.of_layer(index)):
        out = layer(hidden, **kwargs)
        inputs.hidden[position] = out[0] if isinstance(out, tuple) else out
