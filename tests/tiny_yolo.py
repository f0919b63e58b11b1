"""A tiny YOLOv8-shaped detector in torch: SiLU convs, two levels, box and class branches, and Ultralytics' DFL
head (softmax over 16 distance bins, then a 1×1 conv with one output channel whose weight is the ramp 0…15 and
no bias), decoded to pixel boxes and concatenated with sigmoid class scores into [batch, 4 + classes, anchors].

The weights are seeded and random, but the class logits are biased so that a few boxes per image score above
0.25, as a trained detector's do; data is seeded images with bright rectangles.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

CLASSES, BINS, SIDE = 3, 16, 32


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.SiLU())


class DFL(nn.Module):
    """Ultralytics' distribution focal loss integral: expected distance over BINS bins, as a fixed 1×1 conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(BINS, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(BINS, dtype=torch.float32).view(1, BINS, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        return self.conv(x.view(b, 4, BINS, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class TinyYolo(nn.Module):
    """Stem → two strided levels (strides 4 and 8), each with a box and a class branch, then the DFL decode."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(_conv(3, 8, 2), _conv(8, 16, 2))
        self.down = _conv(16, 16, 2)
        self.box = nn.ModuleList(nn.Sequential(_conv(16, 16), nn.Conv2d(16, 4 * BINS, 1)) for _ in range(2))
        self.cls = nn.ModuleList(nn.Sequential(_conv(16, 16), nn.Conv2d(16, CLASSES, 1)) for _ in range(2))
        self.dfl = DFL()
        anchors, strides = [], []
        for stride in (4, 8):
            cells = SIDE // stride
            ys, xs = torch.meshgrid(torch.arange(cells) + 0.5, torch.arange(cells) + 0.5, indexing="ij")
            anchors.append(torch.stack([xs.flatten(), ys.flatten()]))
            strides.append(torch.full((1, cells * cells), float(stride)))
        self.register_buffer("anchors", torch.cat(anchors, 1))
        self.register_buffer("strides", torch.cat(strides, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        levels = [self.stem(images)]
        levels.append(self.down(levels[0]))
        b = images.shape[0]
        outs = [
            torch.cat([self.box[i](x), self.cls[i](x)], 1).view(b, 4 * BINS + CLASSES, -1) for i, x in enumerate(levels)
        ]
        box, cls = torch.cat(outs, 2).split((4 * BINS, CLASSES), 1)
        lt, rb = self.dfl(box).chunk(2, 1)
        centre = self.anchors + (rb - lt) / 2
        size = lt + rb
        return torch.cat([torch.cat([centre, size], 1) * self.strides, cls.sigmoid()], 1)


def build_model() -> nn.Module:
    """The detector with seeded weights; class biases set so that some anchors score above 0.25."""
    torch.manual_seed(0)
    model = TinyYolo().eval()
    with torch.no_grad():
        for branch in model.cls:
            branch[1].bias.fill_(-2.0)
    return model


def _images(seed: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    images = rng.uniform(0.0, 0.3, (count, 3, SIDE, SIDE)).astype(np.float32)
    for image in images:
        for _ in range(int(rng.integers(1, 4))):
            x, y = rng.integers(0, SIDE - 8, 2)
            w, h = rng.integers(6, 16, 2)
            image[:, y : y + h, x : x + w] = rng.uniform(0.6, 1.0, (3, 1, 1))
    return images


def _batches(seed: int, count: int) -> list[tuple[dict[str, np.ndarray], None]]:
    images = _images(seed, count)
    return [({"images": images[i : i + 8]}, None) for i in range(0, count, 8)]


def calibration() -> list[tuple[dict[str, np.ndarray], None]]:
    """32 calibration images."""
    return _batches(20, 32)


def evaluation() -> list[tuple[dict[str, np.ndarray], None]]:
    """32 evaluation images from another seed."""
    return _batches(21, 32)
