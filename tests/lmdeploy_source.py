"""lmdeploy 0.18's own weight readers, imported from its files on the CPU, for the lmdeploy-marked tests.

lmdeploy's code comes from its wheel, installed without dependencies (``pip install --no-deps lmdeploy==0.18.0``)
or unpacked into a folder named by ``DEPLOY_OPT_LMDEPLOY_SRC`` (the folder holding ``lmdeploy/``). Without it the
tests skip, unless ``DEPLOY_OPT_REQUIRE_LMDEPLOY=1`` (CI), where they fail.

What runs, unchanged from lmdeploy 0.18.0's files:

- TurboMind: ``turbomind/checkpoint.py`` ``create_checkpoint`` (a ``SafetensorsCheckpoint`` over our
  model.safetensors) and ``Prefix``; ``turbomind/weight_format.py`` ``WeightFormatResolver.resolve``,
  ``GPTQFormat``/``AWQFormat``/``TrivialFormat`` ``.accepts`` and ``.normalize``, and ``AWQFormat.dequant``;
  ``turbomind/builders/linear.py`` ``_build_linear`` (what ``TextModel._linear`` runs for every Linear); and
  ``turbomind/converter.py`` ``_validate_quant_group_size`` with ``_SUPPORTED_GROUP_SIZES`` and
  ``_DEFAULT_GROUP_SIZES``, compiled from the file's own source (converter.py imports the CUDA extension).
- PyTorch engine: ``pytorch/config.py`` ``QuantizationConfig.from_config`` and ``_patch_quantization_config``;
  ``pytorch/weight_loader/model_weight_loader.py`` ``ModelWeightLoader`` (its safetensors iterator) and
  ``load_weight``; ``pytorch/nn/linear/awq.py`` ``AwqLinear.create_weights``; ``pytorch/backends/default/
  awq_modules.py`` ``dequantize_gemm`` and ``DefaultLinearW4A16Impl.forward`` (the non-CUDA W4A16 Linear).

What is stood in for, because it cannot load without CUDA or pulls the serving stack:

- the package ``__init__`` files of ``lmdeploy`` (fastapi, ray, ...), ``lmdeploy.turbomind`` (loads the
  extension), ``lmdeploy.turbomind.builders``, ``lmdeploy.pytorch.nn`` and ``lmdeploy.pytorch.nn.linear``
  (zmq, ...) are empty packages, so only the modules above execute;
- ``lmdeploy.turbomind._tm``, the ``_turbomind`` extension (it links libcuda.so.1), is an enum of the
  ``DataType`` names the weight formats declare;
- ``SafetensorsCheckpoint.get``/``pop`` end in ``tensor.cuda()``; ``torch.Tensor.cuda`` is the identity where a
  test asks for it (``cpu_tensors``).
"""

from __future__ import annotations

import ast
import enum
import importlib
import importlib.util
import os
import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

LMDEPLOY_SERIES = "0.18."
EMPTY_PACKAGES = ("", "cli", "turbomind", "turbomind.builders", "pytorch.nn", "pytorch.nn.linear")
READER_MODULES = (
    "turbomind.checkpoint",
    "turbomind.weight_format",
    "turbomind.builders.linear",
    "pytorch.config",
    "pytorch.weight_loader.model_weight_loader",
    "pytorch.nn.linear.awq",
    "pytorch.backends.default.awq_modules",
    "cli.utils",
)
TM_DATA_TYPES = (
    "TYPE_INVALID",
    "TYPE_FP16",
    "TYPE_BF16",
    "TYPE_FP32",
    "TYPE_UINT4",
    "TYPE_UINT8",
    "TYPE_INT32",
    "TYPE_GENERIC_FLOAT",
    "TYPE_FP8_E4M3",
    "TYPE_FP4_E2M1",
)
CONVERTER_NAMES = ("_DEFAULT_GROUP_SIZES", "_SUPPORTED_GROUP_SIZES", "_validate_quant_group_size")


def unavailable(reason: str) -> None:
    """Skip, or fail where CI requires lmdeploy (``DEPLOY_OPT_REQUIRE_LMDEPLOY=1``)."""
    if os.environ.get("DEPLOY_OPT_REQUIRE_LMDEPLOY") == "1":
        pytest.fail(f"{reason} (DEPLOY_OPT_REQUIRE_LMDEPLOY=1)")
    pytest.skip(reason)


def lmdeploy_root() -> Path:
    """The ``lmdeploy/`` source folder of a 0.18 wheel, found without importing it."""
    hint = "pip install --no-deps 'lmdeploy==0.18.0', or unpack its wheel and set DEPLOY_OPT_LMDEPLOY_SRC"
    if os.environ.get("DEPLOY_OPT_LMDEPLOY_SRC"):
        root = Path(os.environ["DEPLOY_OPT_LMDEPLOY_SRC"]) / "lmdeploy"
    else:
        spec = importlib.util.find_spec("lmdeploy")
        root = Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None
    if root is None or not (root / "version.py").is_file():
        unavailable(f"lmdeploy's source is not here; {hint}")
    found = re.search(r"__version__ = ['\"]([^'\"]+)", (root / "version.py").read_text())
    version = found.group(1) if found else "unknown"
    if not version.startswith(LMDEPLOY_SERIES):
        unavailable(f"lmdeploy {version} is installed; these tests follow 0.18; {hint}")
    return root


def _tm_stub() -> types.ModuleType:
    """Stands in for the ``_turbomind`` CUDA extension: only the DataType names the weight formats use."""
    stub = types.ModuleType("lmdeploy.turbomind._tm")
    stub.DataType = enum.Enum("DataType", TM_DATA_TYPES)
    return stub


def _converter_rules(root: Path) -> dict:
    """The group-size rules of ``turbomind/converter.py``, compiled from its own source text."""
    tree = ast.parse((root / "turbomind" / "converter.py").read_text(), "converter.py")
    picked = [
        node
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.FunctionDef))
        and (getattr(node, "name", None) or node.targets[0].id) in CONVERTER_NAMES
    ]
    assert len(picked) == len(CONVERTER_NAMES), "lmdeploy's converter.py no longer defines the group-size rules"
    namespace: dict = {}
    exec(compile(ast.Module(body=picked, type_ignores=[]), str(root / "turbomind" / "converter.py"), "exec"), namespace)
    return namespace


@contextmanager
def lmdeploy_readers() -> Iterator[types.SimpleNamespace]:
    """lmdeploy 0.18's reader modules (by last dotted name), its DataType stand-in ``tm`` and converter ``rules``;
    every ``lmdeploy`` module imported before is put back after."""
    root = lmdeploy_root()
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "lmdeploy"}
    for name in saved:
        del sys.modules[name]
    try:
        for dotted in EMPTY_PACKAGES:
            name = f"lmdeploy.{dotted}" if dotted else "lmdeploy"
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*dotted.split(".")))]
            sys.modules[name] = package
        tm = sys.modules["lmdeploy.turbomind"]._tm = sys.modules["lmdeploy.turbomind._tm"] = _tm_stub()
        try:
            modules = {short: importlib.import_module(f"lmdeploy.{short}") for short in READER_MODULES}
        except ModuleNotFoundError as exc:
            unavailable(f"lmdeploy's readers import {exc.name}, which is not installed; pip install {exc.name}")
        yield types.SimpleNamespace(
            tm=tm,
            rules=_converter_rules(root),
            **{short.rsplit(".", 1)[-1]: module for short, module in modules.items()},
        )
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == "lmdeploy"]:
            del sys.modules[name]
        sys.modules.update(saved)


@contextmanager
def cpu_tensors() -> Iterator[None]:
    """``torch.Tensor.cuda`` as the identity, so TurboMind's checkpoint reader runs on the CPU."""
    saved = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = saved


# ---------- one Linear, as each engine reads it ----------


def checkpoint_tensors(lmd: types.SimpleNamespace, folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder, by name, as the PyTorch engine's ``ModelWeightLoader`` yields them."""
    loader = lmd.model_weight_loader.ModelWeightLoader(str(folder))
    return {key: t for path in loader._shard_paths for key, t in loader._get_weights_iterator(path)}


def pytorch_engine_awq(
    lmd: types.SimpleNamespace, tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, int], group: int
) -> tuple[torch.Tensor, ...]:
    """(qweight, scales, qzeros) of the AWQ Linear ``name`` [out, in], loaded into the parameters the PyTorch
    engine's ``AwqLinear.create_weights`` makes (``load_weight`` asserts that the shapes agree)."""
    out_features, in_features = shape
    params = lmd.awq.AwqLinear.create_weights(
        None, in_features, out_features, 4, group, False, torch.float16, torch.device("cpu")
    )[:3]
    for suffix, param in zip(("qweight", "scales", "qzeros"), params, strict=True):
        lmd.model_weight_loader.load_weight(param, tensors[f"{name}.{suffix}"])
    return params


def pytorch_engine_weight(
    lmd: types.SimpleNamespace, tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, int], group: int
) -> torch.Tensor:
    """The PyTorch engine's fp16 dequantized weight of the AWQ Linear ``name``, in its [in, out] layout."""
    qweight, scales, qzeros = pytorch_engine_awq(lmd, tensors, name, shape, group)
    return lmd.awq_modules.dequantize_gemm(qweight, qzeros, scales, 4, group)


def turbomind_linear(lmd: types.SimpleNamespace, folder: Path, name: str, fmt: str, group: int) -> tuple:
    """What TurboMind's converter does for one Linear: resolve its tensors to a format, then ``_build_linear``;
    (the resolved format, the built Linear). Needs ``cpu_tensors``."""
    wf = lmd.weight_format
    quantized = wf.GPTQFormat(block_in=group) if fmt == "gptq" else wf.AWQFormat(block_in=group)
    resolver = wf.WeightFormatResolver(formats=[quantized, wf.TrivialFormat(weight_dtype=lmd.tm.DataType.TYPE_FP16)])
    checkpoint = lmd.checkpoint.create_checkpoint(str(folder))
    resolved, available = resolver.resolve(lmd.checkpoint.Prefix(checkpoint, name))
    return resolved, lmd.linear._build_linear(resolved, available)


def turbomind_weight(lmd: types.SimpleNamespace, folder: Path, name: str, fmt: str, group: int) -> torch.Tensor:
    """TurboMind's fp16 dequantized weight of the Linear ``name`` ([in, out]); ``AWQFormat.dequant`` is its one
    dequantizer of this layout (``GPTQFormat`` normalizes to the same one). Needs ``cpu_tensors``."""
    resolved, linear = turbomind_linear(lmd, folder, name, fmt, group)
    assert resolved.name == fmt, f"TurboMind read {name} as {resolved.name}, not {fmt}"
    return lmd.weight_format.AWQFormat.dequant(resolved, linear.tensors, torch.float16)["weight"]
