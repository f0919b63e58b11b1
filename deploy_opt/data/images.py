"""One image file → one input row, as ``data.preprocess`` says (resize, centre crop, scale, mean/std, layout).

The model input's fixed height and width (when the ONNX file fixes them) are the default output size: with no
``resize`` and no ``crop`` the image is resized to them; with ``resize`` alone it is centre-cropped to them. An
image that cannot be decoded names its file; a size that does not fit names the input, the shape it expects
and the setting to change.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.config.data import PreprocessConfig
from deploy_opt.config.model import InputSpec
from dopt_common.deps import require
from dopt_common.errors import InputError

MAX_PIXELS = 100_000_000  # an image over this many pixels is refused from its header, before it is decoded
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def model_size(spec: InputSpec, layout: str) -> tuple[int | None, int | None]:
    """The (height, width) the input fixes, None where a dimension is dynamic."""
    if len(spec.shape) != 4:
        raise InputError(
            f"input '{spec.name}' has shape {list(spec.shape)}; an image folder feeds a 4-D input ({layout})"
        )
    dims = spec.shape[2:4] if layout == "NCHW" else spec.shape[1:3]
    height, width = (d if isinstance(d, int) else None for d in dims)
    return height, width


def load_image(path: Path, spec: InputSpec, pre: PreprocessConfig, what: str) -> np.ndarray:
    """The preprocessed image at ``path`` as one row of ``spec`` (no batch axis)."""
    return preprocess_image(decode(path, pre.channels, what), path, spec, pre, what)


def preprocess_image(image: Any, path: Path, spec: InputSpec, pre: PreprocessConfig, what: str) -> np.ndarray:
    """A decoded PIL image (RGB or L) as one row of ``spec``; ``path`` names it in errors."""
    image = eight_bit(image).convert("L" if pre.channels == "L" else "RGB")
    height, width = model_size(spec, pre.layout)
    image = _resized(image, pre, (height, width), spec)
    crop = tuple(pre.crop) or ((height, width) if pre.resize and height and width else ())
    if crop:
        image = _center_crop(image, crop, path, spec, what)
    pixels = np.asarray(image, dtype=np.float32)
    pixels = pixels[..., None] if pixels.ndim == 2 else pixels
    if pre.channels == "BGR":
        pixels = pixels[..., ::-1]
    if pre.dtype != "uint8":
        pixels = (pixels * pre.scale - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    row = np.ascontiguousarray(pixels.transpose(2, 0, 1) if pre.layout == "NCHW" else pixels).astype(pre.dtype)
    expected = [d if isinstance(d, int) else "any" for d in spec.shape[1:]]
    if any(isinstance(d, int) and d != n for d, n in zip(spec.shape[1:], row.shape, strict=True)):
        raise InputError(
            f"{what} '{path.name}': input '{spec.name}' expects {expected} per sample, preprocessing gave "
            f"{list(row.shape)}; fix preprocess.resize/crop (size), preprocess.layout ({pre.layout}) or "
            f"preprocess.channels ({pre.channels})"
        )
    return row


def decode(path: Path, channels: str, what: str) -> Any:
    """The image as a PIL image in RGB or L; a file PIL cannot decode, or one over ``MAX_PIXELS`` (checked on its
    header, before decoding), is an InputError naming it."""
    image_module = require("PIL.Image", purpose="image folders", extra="examples")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", image_module.DecompressionBombWarning)  # MAX_PIXELS is the check
            opened = image_module.open(path)
        with opened:
            width, height = opened.size
            if width * height > MAX_PIXELS:
                raise InputError(_too_big(path, f"{width}x{height}, {width * height:,} pixels", what))
            return eight_bit(opened).convert("L" if channels == "L" else "RGB")
    except image_module.DecompressionBombError as exc:
        raise InputError(_too_big(path, str(exc), what)) from exc
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"{what}: cannot decode image '{path}' ({exc}); fix: remove or replace the file") from exc


def _too_big(path: Path, size: str, what: str) -> str:
    return (
        f"{what}: image '{path}' is too large ({size}); the cap is {MAX_PIXELS:,} pixels (MAX_PIXELS); fix: "
        "downscale it"
    )


def eight_bit(image: Any) -> Any:
    """``image`` with 0–255 pixels: 16-bit integers are divided by 257 and 0–1 floats multiplied by 255 (a plain
    ``convert`` would clip both to white or black); 8-bit images are returned as they are."""
    if not (image.mode == "I" or image.mode.startswith("I;16") or image.mode == "F"):
        return image
    image_module = require("PIL.Image", purpose="image folders", extra="examples")
    pixels = np.asarray(image, dtype=np.float64)
    if not np.isfinite(pixels).all():
        raise ValueError(f"its {image.mode} pixels hold NaN or Inf")
    if image.mode == "F":
        pixels = pixels * 255.0 if pixels.max(initial=0.0) <= 1.0 else pixels  # 0–1 floats; else already 0–255
    else:
        pixels = pixels / 257.0  # 65535 → 255: the 16-bit range onto the 8-bit one
    return image_module.fromarray(np.clip(np.round(pixels), 0, 255).astype(np.uint8))


def _resized(image: Any, pre: PreprocessConfig, size: tuple[int | None, int | None], spec: InputSpec) -> Any:
    image_module = require("PIL.Image", purpose="image folders", extra="examples")
    method = getattr(image_module.Resampling, pre.interpolation.upper())
    if len(pre.resize) == 2:
        return image.resize((pre.resize[1], pre.resize[0]), method)
    if len(pre.resize) == 1:
        short = pre.resize[0]
        width, height = image.size
        scale = short / min(width, height)
        return image.resize((max(1, round(width * scale)), max(1, round(height * scale))), method)
    if pre.crop:
        return image
    height, width = size
    if height is None or width is None:
        raise InputError(
            f"input '{spec.name}' has no fixed height and width ({list(spec.shape)}); fix: set preprocess.resize "
            "(and preprocess.crop) to the size the model was trained at"
        )
    return image.resize((width, height), method)


def _center_crop(image: Any, crop: tuple[int, ...], path: Path, spec: InputSpec, what: str) -> Any:
    height, width = crop
    full_width, full_height = image.size
    if full_width < width or full_height < height:
        raise InputError(
            f"{what} '{path.name}': image is {full_height}x{full_width} after resize, smaller than the crop "
            f"{height}x{width} for input '{spec.name}'; fix: raise preprocess.resize or lower preprocess.crop"
        )
    left, top = (full_width - width) // 2, (full_height - height) // 2
    return image.crop((left, top, left + width, top + height))
