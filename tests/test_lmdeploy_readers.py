"""lmdeploy 0.18's own weight readers, run on the CPU over GPTQ and AWQ checkpoints our writer made.

What runs of lmdeploy, and what is stood in for, is in ``tests/lmdeploy_source.py``; without lmdeploy's source
the tests skip, unless ``DEPLOY_OPT_REQUIRE_LMDEPLOY=1`` (CI), where they fail.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import tiny_llama
from lmdeploy_source import (
    checkpoint_tensors,
    cpu_tensors,
    lmdeploy_readers,
    lmdeploy_root,
    pytorch_engine_awq,
    turbomind_linear,
)

from exporters.lmdeploy_engines import pytorch_engine_problems, turbomind_problems
from exporters.w4a16_writer import write_quantized_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.lmdeploy, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def lmd():
    """lmdeploy 0.18's reader functions, imported from its files with the package stand-ins."""
    with lmdeploy_readers() as readers:
        yield readers


@pytest.fixture
def cpu_checkpoint():
    with cpu_tensors():
        yield


# ---------- our checkpoints ----------


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Llama with hidden 128: group 128 divides every Linear, so TurboMind's only group applies."""
    folder = tiny_llama.make_tiny_llama(tmp_path_factory.mktemp("tiny_llama_128") / "model", hidden=128)
    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def checkpoints(llama, tmp_path_factory: pytest.TempPathFactory):
    """(fmt, group, act-order) → (folder, {Linear: QuantizedWeight}, the model holding our dequantized weights)."""
    from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model

    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, 500, (1, 64), generator=gen) for _ in range(8)]
    made = {}
    for fmt, group, desc_act in (("gptq", 128, False), ("gptq", 64, True), ("awq", 128, False), ("awq", 64, False)):
        model = copy.deepcopy(llama)
        settings = EngineSettings(method=fmt, group_size=group, desc_act=desc_act)
        result = quantize_model(model, samples, settings, progress=False)
        folder = tmp_path_factory.mktemp(f"{fmt}{group}") / "checkpoint"
        write_quantized_checkpoint(model, result.weights, folder, fmt=fmt)
        made[fmt, group, desc_act] = (folder, result.weights, model)
    return made


def _ours(model, name: str) -> torch.Tensor:
    """Our dequantized weight of ``name`` in lmdeploy's [in, out] layout."""
    return model.get_submodule(name).weight.detach().t()


# ---------- TurboMind ----------


@pytest.mark.parametrize(("fmt", "group"), [("gptq", 128), ("awq", 128)])
def test_turbomind_reads_our_codes_and_dequantizes_to_our_weights(lmd, checkpoints, cpu_checkpoint, fmt, group):
    folder, weights, model = checkpoints[fmt, group, False]
    for name, qw in weights.items():
        resolved, linear = turbomind_linear(lmd, folder, name, fmt, group)
        assert resolved.name == fmt, name
        tensors = linear.tensors  # TurboMind's layout: weight [in, out] codes, scales and zeros [groups, out]
        assert torch.equal(tensors["weight"].long(), qw.qweight.t().long()), name
        assert torch.equal(tensors["zeros"].long(), qw.zeros.long()), name
        assert torch.equal(tensors["scales"], qw.scales.half()), name
        # AWQFormat.dequant is TurboMind's one dequantizer of this layout (GPTQFormat normalizes to the same one).
        weight = lmd.weight_format.AWQFormat.dequant(resolved, tensors, torch.float16)["weight"]
        torch.testing.assert_close(weight.float(), _ours(model, name), rtol=2e-3, atol=1e-5)
    resolved, _ = turbomind_linear(lmd, folder, "lm_head", fmt, group)
    assert resolved.name == "trivial"  # the kept lm_head is a plain fp16 weight to TurboMind


def test_turbomind_ignores_g_idx_so_act_order_gptq_is_misread(lmd, checkpoints, cpu_checkpoint):
    folder, weights, model = checkpoints["gptq", 64, True]
    name = next(name for name, qw in weights.items() if qw.act_order)
    resolved, linear = turbomind_linear(lmd, folder, name, "gptq", 64)
    assert ".g_idx" not in resolved.suffix_map
    weight = lmd.weight_format.AWQFormat.dequant(resolved, linear.tensors, torch.float16)["weight"]
    assert not torch.allclose(weight.float(), _ours(model, name), rtol=2e-3, atol=1e-5)
    assert any(
        "desc_act" in problem
        for problem in turbomind_problems({"quant_method": "gptq", "group_size": 64, "desc_act": True})
    )


@pytest.mark.parametrize("method", ["awq", "gptq"])
@pytest.mark.parametrize("group", [None, 32, 64, 128, 256, -1])
def test_turbomind_group_rules_match_its_converter(lmd, method, group):
    validate = lmd.rules["_validate_quant_group_size"]
    try:
        resolved = validate(method, group)
    except ValueError as exc:
        assert "Unsupported group_size" in str(exc)
        resolved = None
    if group is not None:
        qconfig = {"quant_method": method, "bits": 4, "group_size": group, "version": "gemm", "sym": True}
        assert (not turbomind_problems(qconfig)) == (resolved is not None), (method, group)
    else:
        assert resolved == 128  # what TurboMind assumes when the config gives none


# ---------- PyTorch engine ----------


@pytest.mark.parametrize("group", [128, 64])
def test_pytorch_engine_loads_our_awq_and_its_linear_matches_ours(lmd, checkpoints, group):
    folder, weights, model = checkpoints["awq", group, False]
    quant = lmd.config.QuantizationConfig.from_config(transformers.AutoConfig.from_pretrained(folder))
    assert (quant.quant_method, quant.bits, quant.group_size) == ("awq", 4, group)
    assert not pytorch_engine_problems({"quant_method": "awq", "bits": 4, "group_size": group})
    tensors = checkpoint_tensors(lmd, folder)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    for name, qw in weights.items():
        out_features, in_features = qw.shape
        qweight, scales, qzeros = pytorch_engine_awq(lmd, tensors, name, qw.shape, quant.group_size)
        weight = lmd.awq_modules.dequantize_gemm(qweight, qzeros, scales, quant.bits, quant.group_size)
        torch.testing.assert_close(weight.float(), _ours(model, name), rtol=2e-3, atol=1e-5)
        impl = lmd.awq_modules.DefaultLinearW4A16Impl(in_features, out_features, quant.bits, quant.group_size)
        y = impl.forward(x[:, :in_features], qweight, scales, qzeros)
        torch.testing.assert_close(y.float(), x[:, :in_features] @ _ours(model, name), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "settings",
    [
        {"method": "gptq", "desc_act": True, "static_groups": True, "sym": False},
        {"method": "awq-gptq"},  # method auto's: AWQ's scales and clip ranges, act-order GPTQ rounding
    ],
    ids=["gptq-static", "awq-gptq"],
)
def test_static_group_act_order_gptq_packs_as_awq_and_the_pytorch_engine_reads_it(
    lmd, llama, tmp_path: Path, settings: dict
):
    """GPTQ's rounding with act-order and static groups keeps one scale and zero point per group, in sequential
    order, so the AWQ layout holds it (no g_idx needed): lmdeploy's PyTorch-engine reader gives our weights back."""
    from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model

    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, 500, (1, 64), generator=gen) for _ in range(8)]
    model = copy.deepcopy(llama)
    weights = quantize_model(model, samples, EngineSettings(group_size=64, **settings), progress=False).weights
    for qw in weights.values():  # one scale and zero point per group, groups in column order
        assert qw.scales.shape[0] == qw.shape[1] // 64 and not qw.act_order
        assert torch.equal(qw.g_idx, (torch.arange(qw.shape[1]) // 64).to(qw.g_idx.dtype))
    folder = write_quantized_checkpoint(model, weights, tmp_path / "checkpoint", fmt="awq")
    quant = lmd.config.QuantizationConfig.from_config(transformers.AutoConfig.from_pretrained(folder))
    tensors = checkpoint_tensors(lmd, folder)
    for name, qw in weights.items():
        qweight, scales, qzeros = pytorch_engine_awq(lmd, tensors, name, qw.shape, quant.group_size)
        weight = lmd.awq_modules.dequantize_gemm(qweight, qzeros, scales, quant.bits, quant.group_size).float()
        # Our codes with the fp16 scales the file holds: lmdeploy's dequantization is exactly that.
        g = qw.g_idx.long()
        expected = ((qw.qweight.float() - qw.zeros.float()[g].t()) * qw.scales.half().float()[g].t()).t()
        assert torch.equal(weight, expected.half().float()), name  # bit for bit, in fp16


def test_pytorch_engine_has_no_gptq_and_no_hf_model_format(lmd, checkpoints):
    folder, _, _ = checkpoints["gptq", 128, False]
    with pytest.raises(TypeError, match="Unsupported quant method: gptq"):
        lmd.config.QuantizationConfig.from_config(transformers.AutoConfig.from_pretrained(folder))
    assert pytorch_engine_problems({"quant_method": "gptq", "bits": 4, "group_size": 128})
    with pytest.raises(RuntimeError, match="Unsupported weight quantization method: hf"):
        lmd.config._patch_quantization_config(transformers.LlamaConfig(), model_format="hf")


# ---------- routing: TurboMind's architectures and the serve command line ----------


def _supported_archs(root: Path) -> set[str]:
    """``SUPPORTED_ARCHS`` of ``turbomind/supported_models.py``, read from its source (it imports lmdeploy.archs)."""
    tree = ast.parse((root / "turbomind" / "supported_models.py").read_text())
    [found] = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SUPPORTED_ARCHS"
    ]
    return {keyword.arg for keyword in found.keywords}


def test_our_turbomind_architectures_are_lmdeploy_s_and_the_cli_routes_by_them(lmd) -> None:
    from exporters.lmdeploy_engines import TURBOMIND_ARCHITECTURES

    root = lmdeploy_root()
    assert set(TURBOMIND_ARCHITECTURES) == _supported_archs(root)
    assert {"MistralForCausalLM", "Phi3ForCausalLM", "GemmaForCausalLM"}.isdisjoint(TURBOMIND_ARCHITECTURES)
    serve_source = (root / "cli" / "serve.py").read_text()  # every --backend but pytorch goes through autoget
    assert "if backend != 'pytorch':" in serve_source and "autoget_backend(args.model_path" in serve_source


def test_our_pytorch_engine_architectures_are_lmdeploy_s_module_map(lmd) -> None:
    """``pytorch/models/module_map.py`` is plain dictionaries: run as it is, its MODULE_MAP's keys are the model
    classes the PyTorch engine builds; every family deploy_opt quantizes but Nemotron is among them."""
    from deploy_opt.llm.architectures import ARCHITECTURES
    from exporters.lmdeploy_engines import PYTORCH_ARCHITECTURES, served_architecture

    namespace: dict = {}
    source = lmdeploy_root() / "pytorch" / "models" / "module_map.py"
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    assert set(PYTORCH_ARCHITECTURES) == set(namespace["MODULE_MAP"])
    unserved = {arch.family for arch in ARCHITECTURES if not served_architecture(arch.hf_architectures[0])}
    assert unserved == {"Nemotron"}


def test_lmdeploy_s_own_argument_parser_takes_our_serve_command(lmd, tmp_path: Path) -> None:
    """The flags and values ``serve`` passes, parsed by lmdeploy 0.18's own ArgumentHelper (cli/utils.py)."""
    import argparse
    import json

    from deploy_opt.config.serve import ServeConfig
    from deploy_opt.llm.serve import serve_command

    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("model_path")
    parser.add_argument("--server-port", type=int)  # cli/serve.py add_parser_api_server
    for helper in ("backend", "model_format", "tp", "session_len"):
        getattr(lmd.utils.ArgumentHelper, helper)(parser)
    for method, arch, backend in (
        ("gptq", "LlamaForCausalLM", "turbomind"),
        ("awq", "LlamaForCausalLM", "turbomind"),
        ("awq", "MistralForCausalLM", "pytorch"),
    ):
        folder = tmp_path / f"{method}-{arch}"
        folder.mkdir()
        qconfig = {"quant_method": method, "bits": 4, "group_size": 128, "version": "gemm", "sym": True}
        (folder / "config.json").write_text(json.dumps({"architectures": [arch], "quantization_config": qconfig}))
        args = parser.parse_args(serve_command(folder, ServeConfig(session_len=4096))[3:])
        assert args.backend == backend and args.model_format == (method if backend == "turbomind" else None)
        assert args.session_len == 4096


# ---------- quantize-llm auto on an architecture TurboMind lacks ----------


def _tiny_mistral(folder: Path) -> Path:
    """A random MistralForCausalLM with hidden 128: group 128 divides every Linear (GPTQ's case before issue 33)."""
    torch.manual_seed(0)
    tokenizer = tiny_llama.train_tokenizer()
    config = tiny_llama.decoder_config(
        transformers.MistralConfig,
        len(tokenizer),
        hidden=128,
        max_position_embeddings=512,
        sliding_window=None,
        tie_word_embeddings=False,
        **tiny_llama.special_ids(tokenizer),
    )
    transformers.MistralForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_auto_on_a_mistral_writes_awq_that_the_pytorch_engine_reads(lmd, tmp_path: Path) -> None:
    from deploy_opt.llm.config import load_llm_config
    from deploy_opt.llm.pipeline import run_quantize_llm

    source = _tiny_mistral(tmp_path / "mistral")
    flags = {
        "name": "mistral",
        "model": {"path": str(source)},
        "calibration": {"samples": 8, "max_seq_len": 32},
        "checks": {"eval_tokens": 64, "eval_seq_len": 32, "generations": 1, "max_new_tokens": 4},
    }
    report = run_quantize_llm(load_llm_config(None, flags), tmp_path / "out", progress=False).report.to_json()
    scheme = report["scheme"]
    assert (scheme["method"], scheme["layout"], scheme["group_size"]) == ("awq-gptq", "awq", 128)
    assert "MistralForCausalLM is not in TurboMind's list" in report["scheme"]["reason"]
    assert report["serve"]["servable"] and report["serve"]["backend"] == "pytorch"
    folder = tmp_path / "out" / "mistral" / "checkpoint"
    quant = lmd.config.QuantizationConfig.from_config(transformers.AutoConfig.from_pretrained(folder))
    assert (quant.quant_method, quant.bits, quant.group_size) == ("awq", 4, 128)
    tensors = checkpoint_tensors(lmd, folder)
    name = "model.layers.0.mlp.down_proj"
    qweight, scales, qzeros = pytorch_engine_awq(lmd, tensors, name, (128, 256), quant.group_size)
    weight = lmd.awq_modules.dequantize_gemm(qweight, qzeros, scales, quant.bits, quant.group_size)
    assert weight.shape == (256, 128) and torch.isfinite(weight.float()).all()
