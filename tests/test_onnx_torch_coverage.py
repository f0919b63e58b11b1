"""The torch evaluator runs real exports and the ONNX model zoo exactly as ONNX Runtime does.

Real graphs: a tiny random BERT and a tiny random Llama, each exported by the dynamo exporter (opset 18) and by
TorchScript (opset 17) through the build's own ``export_onnx``, and each export simplified as the build does it
(``simplify_onnx``: onnxsim, else onnxslim). Then every ``light_*`` model of onnx's backend test data (AlexNet,
DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512; opset 9). Those files hold
every weight as a ConstantOfShape of 0.02, which makes every channel alike and every output class equal, so the
weights become random inputs here (and each Softmax's input is compared too).
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tiny_llama
import torch
from onnx import TensorProto, helper, numpy_helper

from deploy_opt.onnx_torch import initializer_tensors, run_graph, unsupported_ops
from dopt_common.ort import create_session
from exporters.onnx.checks import simplify_onnx
from exporters.onnx.export import export_onnx

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ZOO = sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx"))
# The two largest on a 2-core CPU; every operator type they hold is in the others (see the last test).
SLOW_ZOO = ("densenet121", "vgg19")
BATCH, SEQ, VOCAB = 2, 8, 100


class _HiddenStates(torch.nn.Module):
    """A transformers model as (input_ids, attention_mask) → tensors, without the cache and output classes."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)
        if hasattr(out, "logits"):
            return (out.logits,)
        return out.last_hidden_state, out.pooler_output


def _tiny_bert() -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    return _HiddenStates(BertModel(config).eval()).eval()


def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_llama.decoder_config(LlamaConfig, VOCAB, max_position_embeddings=64)
    return _HiddenStates(LlamaForCausalLM(config).eval()).eval()


def _token_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    """Two sequences; the second ends in padding (mask zeros)."""
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 5:] = 0
    ids = np.random.default_rng(seed).integers(1, VOCAB, (BATCH, SEQ)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, onnx.ModelProto]:
    """name → model: {bert, llama} x {dynamo opset 18, torchscript opset 17} x {as exported, simplified}.

    Simplified: by the build's ``simplify_onnx`` (onnxsim when it succeeds), and by onnxslim (its fallback).
    """
    import onnxslim

    folder = tmp_path_factory.mktemp("exports")
    example = [torch.from_numpy(v) for v in _token_feeds().values()]
    axes = {name: {0: "batch", 1: "sequence"} for name in ("input_ids", "attention_mask")}
    models = {}
    for family, build in (("bert", _tiny_bert), ("llama", _tiny_llama)):
        module = build()
        outputs = ["logits"] if family == "llama" else ["last_hidden_state", "pooler_output"]
        for exporter, opset in (("dynamo", 18), ("torchscript", 17)):
            raw = folder / f"{family}_{exporter}.onnx"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                export_onnx(
                    module,
                    example,
                    raw,
                    input_names=list(axes),
                    output_names=outputs,
                    dynamic_axes=axes,
                    exporter=exporter,
                    opset=opset,
                )
            simple = folder / f"{family}_{exporter}_simplified.onnx"
            tool = simplify_onnx(raw, simple)
            logging.getLogger(__name__).info("%s simplified with %s", simple.name, tool)
            models[f"{family}_{exporter}"] = onnx.load(str(raw))
            models[f"{family}_{exporter}_simplified"] = onnx.load(str(simple))
            models[f"{family}_{exporter}_onnxslim"] = onnxslim.slim(onnx.load(str(raw)))
    return models


def _assert_matches_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-4) -> None:
    """Every graph output equals ONNX Runtime's to ``rtol`` of that output's largest magnitude."""
    assert unsupported_ops(model) == []
    expected = create_session(model.SerializeToString()).run(None, feeds)
    with torch.no_grad():
        env = run_graph(model, feeds)
    for output, reference in zip(model.graph.output, expected, strict=True):
        got = env[output.name].numpy()
        assert got.shape == reference.shape and got.dtype == reference.dtype, output.name
        scale = max(float(np.abs(reference).max()), 1e-6)
        np.testing.assert_allclose(got, reference, rtol=rtol, atol=rtol * scale, err_msg=output.name)


EXPORTS = [
    f"{family}_{exporter}{suffix}"
    for family in ("bert", "llama")
    for exporter in ("dynamo", "torchscript")
    for suffix in ("", "_simplified", "_onnxslim")
]


@pytest.mark.parametrize("name", EXPORTS)
@pytest.mark.slow
def test_transformer_exports_match_onnxruntime(exports: dict[str, onnx.ModelProto], name: str) -> None:
    _assert_matches_onnxruntime(exports[name], _token_feeds(seed=1))


@pytest.mark.slow
def test_gradients_reach_a_matmul_inside_the_exported_bert(exports: dict[str, onnx.ModelProto]) -> None:
    """The proxy's use: a zero tap on a MatMul output gets d(output)/d(tap), equal to a finite difference."""
    model = exports["bert_dynamo"]
    tapped = [n for n in model.graph.node if n.op_type == "MatMul"][4]
    feeds, constants = _token_feeds(seed=2), initializer_tensors(model)
    output = model.graph.output[0].name
    taps: dict[str, torch.Tensor] = {}

    def hook(node: onnx.NodeProto, inputs: list[Any], outputs: list[Any]) -> list[Any] | None:
        if node.name != tapped.name:
            return None
        taps["leaf"] = torch.zeros_like(outputs[0], requires_grad=True)
        return [outputs[0] + taps["leaf"], *outputs[1:]]

    with torch.enable_grad():
        y = run_graph(model, feeds, hook, constants)[output]
        direction = torch.randn(y.shape, generator=torch.Generator().manual_seed(0))
        (grad,) = torch.autograd.grad((y * direction).sum(), [taps["leaf"]])
    assert torch.isfinite(grad).all() and grad.abs().max() > 0
    bump = torch.randn(grad.shape, generator=torch.Generator().manual_seed(1)) * 1e-2

    def shifted(sign: float) -> float:
        def push(node: onnx.NodeProto, inputs: list[Any], outputs: list[Any]) -> list[Any] | None:
            return [outputs[0] + sign * bump, *outputs[1:]] if node.name == tapped.name else None

        with torch.no_grad():
            return float((run_graph(model, feeds, push, constants)[output].double() * direction).sum())

    finite = (shifted(1.0) - shifted(-1.0)) / 2
    assert float((grad * bump).sum()) == pytest.approx(finite, rel=2e-2)


def _random_weights(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Replace every ConstantOfShape weight by a graph input; returns random values for them (He-scaled)."""
    shapes = {i.name: numpy_helper.to_array(i).tolist() for i in model.graph.initializer}
    batch_norm = {
        name: k for n in model.graph.node if n.op_type == "BatchNormalization" for k, name in enumerate(n.input)
    }
    values, kept = {}, []
    for node in model.graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in shapes:
            kept.append(node)
            continue
        shape, name = shapes[node.input[0]], node.output[0]
        if len(shape) >= 2:
            values[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(
                math.sqrt(2 / math.prod(shape[1:]))
            )
        elif batch_norm.get(name) in (1, 4):  # scale, variance
            values[name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            values[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.input.extend(helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in values.items())
    return values


def _zoo_case(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    rng = np.random.default_rng(0)
    feeds = _random_weights(model, rng)
    inits = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name not in inits and value.name not in feeds:
            shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
            feeds[value.name] = rng.standard_normal(shape, dtype=np.float32)
    logits = [n.input[0] for n in model.graph.node if n.op_type == "Softmax"]
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in logits)
    return model, feeds


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ZOO else n for n in ZOO])
def test_onnx_zoo_models_match_onnxruntime(name: str) -> None:
    model, feeds = _zoo_case(name)
    _assert_matches_onnxruntime(model, feeds)


def test_the_fast_zoo_models_hold_every_zoo_operator() -> None:
    def op_types(name: str) -> set[str]:
        return {n.op_type for n in onnx.load(str(LIGHT / f"light_{name}.onnx")).graph.node}

    assert len(ZOO) == 9, ZOO
    fast = set().union(*(op_types(n) for n in ZOO if n not in SLOW_ZOO))
    assert set().union(*(op_types(n) for n in SLOW_ZOO)) <= fast
