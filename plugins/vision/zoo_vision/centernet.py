"""CenterNet: an anchor-free single-stage detector that finds objects as points.

Reference: Zhou, Wang and Krähenbühl, "Objects as Points" (2019), arXiv:1904.07850.
A small residual backbone with a feature pyramid (Lin et al., "Feature Pyramid Networks
for Object Detection", 2017) produces stride-4 features; three heads predict a heatmap
of object centres per class, the box size and the sub-cell offset of each centre.

Decoding is part of the module, so an exported artifact returns finished detections:
CenterNet's 3x3 max-pool keeps only local peaks of the heatmap (the paper's replacement
for IoU-based non-maximum suppression), one cell per plateau of equal scores (`local_peaks`:
int8 and bf16 heatmaps hold such plateaus), then the top K peaks over all classes become
fixed-size outputs. Those scoring at least MIN_SCORE come first, ordered by their flat
index class * H * W + cell (by class, then heatmap cell in row-major order) rather than
by score, and the rest are empty rows (box 0, score 0, class -1): a near-tie between two
scores (backends differ by ~1e-6) then cannot swap two rows. It does not make the top K
immune to near-ties: on 498 of 500 held-out scenes all 20 rows of the trained model hold
weak background peaks scoring at least MIN_SCORE, and its 20th and 21st peaks were as
close as 1.05e-5, so two backends can keep a different K-th peak, and then every row
between the two peaks' indices moves by one (as a score within ~1e-6 of MIN_SCORE can).
Rows in score order would confine that to the last row but let any two near-tied rows
swap, among ~20 weak peaks a scene: more chances to differ at fp32, where boxes are
compared row by row. Below fp32 the decoded rows are held by mAP (detection.py).
The raw head maps are an output too: the training loss needs them, and the core
training loop sees exactly the outputs an artifact has.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .detection import STRIDE
from .resnet import BasicBlock

#: initial heatmap bias: every cell starts at probability 0.1 (the paper's -2.19), so the
#: focal loss is not swamped by the background in the first steps (RetinaNet's prior).
HEATMAP_PRIOR = 0.1
#: detections scoring less are empty rows: far below any useful operating point (COCO
#: evaluations keep scores down to 0.001-0.05), and it keeps the output deterministic.
MIN_SCORE = 0.01


def _conv_bn(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def _head(width: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(width, width, 3, 1, 1), nn.ReLU(inplace=True), nn.Conv2d(width, out, 1))


class CenterNet(nn.Module):
    """image (B, 3, S, S) in [0, 1] -> boxes (B, K, 4) [x1, y1, x2, y2] in input pixels,
    scores (B, K), classes (B, K) int64 (-1 for an empty row), heads (B, C + 4, S/4, S/4)."""

    def __init__(self, num_classes: int, width: int = 32, image_size: int = 64, max_detections: int = 20) -> None:
        super().__init__()
        if image_size % (8 * STRIDE):
            raise ValueError(f"image_size must be a multiple of {8 * STRIDE}, got {image_size}")
        self.num_classes, self.image_size, self.max_detections = num_classes, image_size, max_detections
        w = width
        self.stem = nn.Sequential(_conv_bn(3, w // 2, 2), _conv_bn(w // 2, w, 2))  # -> stride 4
        self.c4 = BasicBlock(w, w, 1)
        self.c8 = nn.Sequential(BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w, 1))
        self.c16 = nn.Sequential(BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w, 1))
        # top-down pathway: coarse context upsampled and added to finer features
        self.lateral16 = nn.Conv2d(4 * w, w, 1)
        self.lateral8 = nn.Conv2d(2 * w, w, 1)
        self.smooth = _conv_bn(w, w, 1)
        self.heatmap = _head(w, num_classes)
        self.size = _head(w, 2)  # box width and height, in output cells
        self.offset = _head(w, 2)  # centre minus its cell's corner, in output cells
        # He init for the convolutions that feed a BatchNorm: training normalizes their
        # scale away, but an untrained network in eval mode (BatchNorm then the identity)
        # keeps it, and PyTorch's default init shrinks activations ~1.7x per conv. Its
        # heatmap would come out flat to 1e-4, and the top K would be picked among
        # near-ties that backends order differently. The heads keep the default init,
        # which trains better here.
        for part in (self.stem, self.c4, self.c8, self.c16, self.smooth):  # every conv here feeds a BatchNorm
            for m in part.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        nn.init.constant_(self.heatmap[-1].bias, -math.log((1 - HEATMAP_PRIOR) / HEATMAP_PRIOR))

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        f4 = self.c4(self.stem(image))
        f8 = self.c8(f4)
        f16 = self.c16(f8)
        p8 = self.lateral8(f8) + F.interpolate(self.lateral16(f16), scale_factor=2.0, mode="nearest")
        p4 = f4 + F.interpolate(p8, scale_factor=2.0, mode="nearest")
        x = self.smooth(p4)
        heads = torch.cat([self.heatmap(x), self.size(x), self.offset(x)], dim=1)
        return (*self.decode(heads), heads)

    def decode(self, heads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Peaks of the class heatmaps -> the top K boxes, scores and classes."""
        c, k = self.num_classes, self.max_detections
        b, _, h, w = heads.shape
        n = c * h * w
        heat = torch.sigmoid(heads[:, :c])
        peak = local_peaks(heat)
        top, index = (heat * peak).flatten(1).topk(k, dim=1)  # (B, K) over C*H*W
        # rows: the detections scoring at least MIN_SCORE in flat-index order, then empty rows
        # (a sort key that puts the weak ones after every index)
        key = (index + (top < MIN_SCORE).long() * n).sort(dim=1).values
        kept = key < n
        index = key - (~kept).long() * n
        scores = heat.flatten(1).gather(1, index)
        classes = torch.div(index, h * w, rounding_mode="floor")
        cell = index - classes * (h * w)
        ys = torch.div(cell, w, rounding_mode="floor")
        xs = cell - ys * w
        regress = heads[:, c:].flatten(2)  # (B, 4, H*W): size x, size y, offset x, offset y
        at = regress.gather(2, cell.unsqueeze(1).expand(b, 4, k))
        cx = (xs.to(heads.dtype) + at[:, 2]) * STRIDE
        cy = (ys.to(heads.dtype) + at[:, 3]) * STRIDE
        half_w, half_h = at[:, 0].clamp(min=0.0) * (STRIDE / 2), at[:, 1].clamp(min=0.0) * (STRIDE / 2)
        boxes = torch.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], dim=2)
        boxes = torch.where(kept.unsqueeze(2), boxes.clamp(0.0, float(self.image_size)), 0.0)
        return boxes, torch.where(kept, scores, 0.0), torch.where(kept, classes, -1)


def local_peaks(heat: torch.Tensor) -> torch.Tensor:
    """Where `heat` (B, C, H, W) holds a local maximum of its 3x3 neighbourhood, one cell per
    plateau: a cell no higher than a neighbour before it in row-major order (to its left or
    in the row above) is not a peak. Quantized heatmaps (int8 steps, bf16's 8 bits) hold
    plateaus of equal values, and `max_pool == heat` alone kept every cell of one as a peak:
    the same object reported twice. Not passed along a plateau: one that widens leftwards by
    two cells or more from a row to the next keeps a cell in each such row (an L of cells
    (1, 3), (2, 2), (2, 1) keeps two); none of 500 held-out scenes held one at int8.

    Only slices of `heat` are compared, and the missing neighbours of the border are boolean
    columns and rows: a static int8 graph requantizes a slice or a max-pool with the scale of
    its input, so equal values stay equal, where a padded copy got a scale of its own
    (onnxruntime's quantizer) and its plateaus no longer compared equal."""
    peak = F.max_pool2d(heat, 3, stride=1, padding=1) == heat
    below, above = heat[..., 1:, :], heat[..., :-1, :]
    column = torch.zeros_like(below[..., :1], dtype=torch.bool)  # no neighbour there
    up = ((below <= above)
          | torch.cat([column, below[..., 1:] <= above[..., :-1]], dim=-1)  # up-left
          | torch.cat([below[..., :-1] <= above[..., 1:], column], dim=-1))  # up-right
    left = torch.cat([torch.zeros_like(heat[..., :1], dtype=torch.bool), heat[..., 1:] <= heat[..., :-1]], dim=-1)
    before = torch.cat([torch.zeros_like(heat[..., :1, :], dtype=torch.bool), up], dim=-2) | left
    return peak & ~before


def gaussian_targets(targets: torch.Tensor, num_classes: int, size: int) -> tuple[torch.Tensor, ...]:
    """The training targets of a batch of padded [class, x1, y1, x2, y2] rows.

    Returns the heatmap (B, C, H, W): per class, the maximum over its objects of an
    elliptical Gaussian that is exactly 1 at the object's centre cell, with a standard
    deviation of a sixth of the box (TTFNet's box-shaped Gaussians, Liu et al. 2019,
    rather than the paper's round IoU-derived radius); and per object the centre cell's
    flat index (B, M), size and offset targets (B, M, 2, 2 stacked as size, offset), and
    a validity mask (B, M).
    """
    h = w = size // STRIDE
    valid = targets[..., 0] >= 0
    cls = targets[..., 0].clamp(min=0).long()
    box = targets[..., 1:] / STRIDE
    centre = (box[..., :2] + box[..., 2:]) / 2
    extent = (box[..., 2:] - box[..., :2]).clamp(min=1e-3)
    cell = centre.floor().clamp(min=0, max=h - 1)
    sigma = (extent / 6).clamp(min=0.5)
    gy = torch.arange(h, dtype=targets.dtype, device=targets.device).view(1, 1, h, 1)
    gx = torch.arange(w, dtype=targets.dtype, device=targets.device).view(1, 1, 1, w)
    dx = (gx - cell[..., 0, None, None]) / sigma[..., 0, None, None]
    dy = (gy - cell[..., 1, None, None]) / sigma[..., 1, None, None]
    blobs = torch.exp(-(dx**2 + dy**2) / 2) * valid[..., None, None]  # (B, M, H, W)
    onehot = F.one_hot(cls, num_classes).to(targets.dtype) * valid[..., None]  # (B, M, C)
    heatmap = (blobs[:, :, None] * onehot[..., None, None]).amax(dim=1)  # (B, C, H, W)
    index = (cell[..., 1] * w + cell[..., 0]).long()
    return heatmap, index, extent, centre - cell, valid


def centernet_loss(heads: torch.Tensor, targets: torch.Tensor, num_classes: int, size: int) -> torch.Tensor:
    """The paper's loss: penalty-reduced focal loss on the heatmap (CornerNet's, with
    alpha 2 and beta 4) plus L1 on size (weight 0.1) and offset at object centres."""
    heatmap, index, extent, offset, valid = gaussian_targets(targets, num_classes, size)
    logits = heads[:, :num_classes]
    p = torch.sigmoid(logits)
    pos = heatmap == 1.0
    pos_loss = F.logsigmoid(logits) * (1 - p) ** 2 * pos
    neg_loss = F.logsigmoid(-logits) * p**2 * (1 - heatmap) ** 4 * ~pos
    n = valid.sum().clamp(min=1)
    focal = -(pos_loss.sum() + neg_loss.sum()) / n
    regress = heads[:, num_classes:].flatten(2)  # (B, 4, H*W)
    at = regress.gather(2, index.unsqueeze(1).expand(-1, 4, -1)).transpose(1, 2)  # (B, M, 4)
    mask = valid[..., None].to(heads.dtype)
    size_l1 = ((at[..., :2] - extent).abs() * mask).sum() / n
    offset_l1 = ((at[..., 2:] - offset).abs() * mask).sum() / n
    return focal + 0.1 * size_l1 + offset_l1
