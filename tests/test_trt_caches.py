"""Whole TensorRT calibration caches (``tests/data/trt_caches``): the unpadded forms TensorRT really writes.

TensorRT writes a scale's float32 bits with ``std::hex``: no leading zeros, so a tiny scale is a 7-digit line and a
tensor whose range is zero is ``name: 0``. ``scales import`` must take both (issue 33).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from deploy_opt.analysis.scale_interop import export_scales, import_scales
from dopt_common.files import write_json
from exporters.tensorrt.cache import ZERO_RANGE_SCALE, parse_trt_cache, read_trt_cache

CACHES = Path(__file__).resolve().parent / "data" / "trt_caches"
WHOLE = sorted(p.name for p in CACHES.glob("*.cache"))


def _lines(name: str) -> list[tuple[str, str]]:
    body = (CACHES / name).read_text().splitlines()[1:]
    return [tuple(line.rsplit(": ", 1)) for line in body if line.strip()]  # type: ignore[misc]


def test_the_fixtures_hold_both_unpadded_forms() -> None:
    values = [value for name in WHOLE for _, value in _lines(name)]
    assert values.count("0") >= 3 and sum(len(v) == 7 for v in values) >= 3
    assert {(CACHES / n).read_text().splitlines()[0] for n in WHOLE} == {
        "TRT-8400-EntropyCalibration2",
        "TRT-100001-EntropyCalibration2",
    }


@pytest.mark.parametrize("name", WHOLE)
def test_every_line_of_a_whole_cache_parses_to_its_own_bits(name: str) -> None:
    cache = read_trt_cache(CACHES / name)
    lines = _lines(name)
    assert list(cache.scales) == [tensor for tensor, _ in lines]
    for tensor, value in lines:
        entry = cache.scales[tensor]
        bits = struct.unpack(">f", int(value, 16).to_bytes(4, "big"))[0]  # an independent decoder
        if value == "0":
            assert (entry.scale, entry.amax, entry.range) == ((ZERO_RANGE_SCALE,), 0.0, (0.0, 0.0))
        else:
            assert entry.scale == (bits,) and entry.amax == pytest.approx(127 * bits, rel=1e-12)
            assert entry.scale_bits == (value.rjust(8, "0"),)


def test_the_versions_decode_and_the_ranges_are_plausible() -> None:
    resnet = read_trt_cache(CACHES / "resnet18_entropy2_trt8400.cache")
    assert (resnet.version, resnet.algorithm) == ("8.4.0", "EntropyCalibration2")
    assert resnet.scales["input"].amax == pytest.approx(2.64, rel=1e-5)  # ImageNet-normalised input
    tiny = resnet.scales["(Unnamed Layer* 65) [Constant]_output"]
    assert 0 < tiny.scale[0] < 1e-30  # a 7-digit line is a vanishing range, not a mis-padded normal one
    minilm = read_trt_cache(CACHES / "minilm_entropy2_trt100001.cache")
    assert minilm.version == "10.0.1"
    assert minilm.scales["/encoder/layer.0/attention/self/Softmax_output_0"].amax == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("name", WHOLE)
def test_scales_import_takes_a_whole_cache_and_export_writes_its_zero_lines_back(name: str, tmp_path: Path) -> None:
    scales = import_scales(CACHES / name)  # validates against the scales.json schema
    assert len(scales.tensors) == len(_lines(name)) and scales.activations == "symmetric"
    path = write_json(tmp_path / "scales.json", scales.to_json())
    back = parse_trt_cache(export_scales(path, "trt-cache", tmp_path / "calibration.cache").read_text())
    for tensor, _ in _lines(name):
        assert back.scales[tensor].scale_bits == scales.tensors[tensor].scale_bits
        assert back.scales[tensor].amax == scales.tensors[tensor].amax
    written = dict(_lines_of(tmp_path / "calibration.cache"))
    assert [t for t, v in _lines(name) if v == "0"] == [t for t, v in written.items() if v == "0"]


def _lines_of(path: Path) -> list[tuple[str, str]]:
    return [tuple(line.rsplit(": ", 1)) for line in path.read_text().splitlines()[1:]]  # type: ignore[misc]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("x: 123456789", r"1 to 8 hex digits"),
        ("x: ", r"1 to 8 hex digits"),
        ("x: 80000000", r"holds scale -0.0"),
        ("x: ff800000", r"holds scale -inf, which is not a positive finite number"),
    ],
)
def test_what_tensorrt_never_writes_is_still_refused(line: str, match: str) -> None:
    from dopt_common.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        parse_trt_cache(f"TRT-8400-EntropyCalibration2\n{line}\n")
