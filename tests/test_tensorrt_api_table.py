"""``scripts/tensorrt_api_table.py``: the per-version table from the bindings wheels' strings.

- On wheels built here (an ``__init__.py`` and a ``tensorrt.so`` of NUL-separated strings laid out as the real
  ones are): a member is present by its own docstring, not by a name another enum shares ("INT8" lives on as the
  tail of "UINT8"), and a deprecation is the member's own, not a later one in the same docstring.
- On the real wheels, where ``DEPLOY_OPT_TRT_WHEELS`` names a folder holding them (a maintainer's check, skipped
  otherwise; the tests never download): the table on disk is exactly what the script writes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest
from api_surface import TABLE_PATH

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "tensorrt_api_table.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("tensorrt_api_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _wheel(path: Path, version: str, strings: list[str]) -> Path:
    """A bindings wheel in miniature: the strings as a pybind11 .so holds them, between binary noise."""
    binary = b"\x7fELF\x02\x01\x00" + b"\x00".join(s.encode() for s in strings) + b"\x00\x90\x01"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("tensorrt_bindings/__init__.py", f'__version__ = "{version}"\n\n\ndef nptype(t):\n    pass\n')
        archive.writestr("tensorrt_bindings/tensorrt.so", binary)
    return path


def _strings(script, table: dict, drop: tuple[str, ...] = ()) -> list[str]:
    """Every name and docstring the table's members need, less the docstrings of ``drop``."""
    section = table["tensorrt"]
    names = [dotted.rsplit(".", 1)[-1] for dotted in script.listed_members(section)]
    docs = [fps[0] for dotted, fps in script.DOCSTRINGS.items() if dotted not in drop]
    return [*names, *docs, "UINT8"]


def test_a_member_is_decided_by_its_own_docstring_not_a_shared_name(script, tmp_path) -> None:
    table = json.loads(TABLE_PATH.read_text())
    flags = ("BuilderFlag.INT8", "BuilderFlag.FP16")
    old = _strings(script, table, drop=flags) + [
        "Enable Int8 layer selection.\n    [DEPRECATED] Deprecated in TensorRT 10.12. Superseded by strong typing.",
        "Enable FP16 layer selection.\n    [DEPRECATED] Deprecated in TensorRT 10.12. Superseded by strong typing.",
    ]
    new = _strings(script, table, drop=flags)
    assert "INT8" in new  # the name survives (DataType.INT8, and here as the enum list's name)
    wheels = [
        script.Bindings(_wheel(tmp_path / "a.whl", "10.16.1.11", old)),
        script.Bindings(_wheel(tmp_path / "b.whl", "11.4.0.106", new)),
    ]
    out = script.regenerate(table, wheels)["tensorrt"]
    assert out["versions"]["11.4.0.106"]["absent"] == ["BuilderFlag.FP16", "BuilderFlag.INT8"]
    assert out["versions"]["10.16.1.11"]["absent"] == []
    assert out["versions"]["10.16.1.11"]["deprecated"]["BuilderFlag.INT8"] == "10.12: Superseded by strong typing."
    assert out["enum_notes"]["BuilderFlag.INT8"].endswith("absent from 11.4.0.106")


def test_a_deprecation_further_down_a_docstring_is_not_the_members(script, tmp_path) -> None:
    workspace = (
        "\n    WORKSPACE is used by TensorRT to store intermediate buffers within an operation.\n"
        "    This defaults to max device memory.\n"
        "    For more targeted removal use IAlgorithmSelector ([DEPRECATED] Deprecated in TensorRT 10.8.)."
    )
    wheel = script.Bindings(_wheel(tmp_path / "w.whl", "10.16.1.11", [workspace, "Enable FP16 layer selection."]))
    assert wheel.docstring(script.DOCSTRINGS["MemoryPoolType.WORKSPACE"]).deprecated is None
    found = wheel.docstring(script.DOCSTRINGS["BuilderFlag.FP16"])
    assert found.present and found.deprecated is None
    assert not wheel.docstring(script.DOCSTRINGS["BuilderFlag.INT8"]).present


def test_a_member_no_wheel_has_stops_the_script(script, tmp_path) -> None:
    table = json.loads(TABLE_PATH.read_text())
    strings = [s for s in _strings(script, table) if s != "get_tensor_profile_shape"]
    with pytest.raises(SystemExit, match="no wheel has.*ICudaEngine.get_tensor_profile_shape"):
        script.regenerate(table, [script.Bindings(_wheel(tmp_path / "a.whl", "10.16.1.11", strings))])


@pytest.mark.skipif(
    not os.environ.get("DEPLOY_OPT_TRT_WHEELS"),
    reason="maintainer check: set DEPLOY_OPT_TRT_WHEELS to a folder with the tensorrt_cu*_bindings wheels",
)
def test_the_table_on_disk_is_what_the_real_wheels_give(script) -> None:
    folder = Path(os.environ["DEPLOY_OPT_TRT_WHEELS"])
    wheels = sorted(folder.glob("tensorrt_cu*_bindings-*.whl"))
    versions = {w.name.split("-")[1] for w in wheels}
    assert set(script.WHEELS) <= versions, f"{folder} lacks the wheels of {sorted(set(script.WHEELS) - versions)}"
    chosen = [w for w in wheels if w.name.split("-")[1] in script.WHEELS]
    assert script.main([*map(str, chosen), "--check"]) == 0
