"""ResNet, written here so the plugin needs no torchvision.

References: He et al., "Deep Residual Learning for Image Recognition" (2015), and the
"ResNet strikes back" practice of zero-initialising the last BatchNorm of each residual
branch, so every block starts as the identity: activations stay bounded at random
init, which matters here because untrained standard-size ResNets are exported and
verified too.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.last_bn = self.bn2
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4  # 1x1 reduce, 3x3, 1x1 expand to 4x the width

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)  # stride on the 3x3, as in "ResNet v1.5"
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.last_bn = self.bn3
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


#: depth -> (block, blocks per stage); stages double the width and halve the resolution.
LAYOUTS = {
    8: (BasicBlock, (1, 1, 1)),  # the CIFAR-style 3-stage net used for small images
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
    101: (Bottleneck, (3, 4, 23, 3)),
}


class ResNet(nn.Module):
    """ResNet-`depth` classifier.

    stem="imagenet": 7x7/2 conv + 3x3/2 max-pool (for 224x224 inputs);
    stem="small": one 3x3/1 conv, no pooling (for 8x8 or 32x32 inputs, where the
    ImageNet stem would discard most of the image).
    """

    def __init__(self, depth: int = 18, num_classes: int = 1000, in_chans: int = 3, width: int = 64,
                 stem: str = "imagenet") -> None:
        super().__init__()
        block, stages = LAYOUTS[depth]
        if stem == "imagenet":
            self.stem = nn.Sequential(nn.Conv2d(in_chans, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        else:
            self.stem = nn.Sequential(nn.Conv2d(in_chans, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True))
        layers, cin = [], width
        for i, n in enumerate(stages):
            for j in range(n):
                layers.append(block(cin, width * 2**i, stride=2 if i > 0 and j == 0 else 1))
                cin = width * 2**i * block.expansion
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, num_classes)
        self.grad_checkpointing = False
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        for m in self.layers:
            nn.init.zeros_(m.last_bn.weight)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each residual block's activations in backward (timm's API). The
        recomputation normalizes by the batch's statistics, as the forward did, but leaves
        BatchNorm's running statistics alone (timm's updates them a second time), so
        training with it reaches the same weights and running statistics as without."""
        self.grad_checkpointing = enable

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        for block in self.layers:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False,
                               context_fn=lambda b=block: (contextlib.nullcontext(), _running_stats_frozen(b)))
            else:
                x = block(x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


@contextlib.contextmanager
def _running_stats_frozen(module: nn.Module) -> Iterator[None]:
    """While `checkpoint` recomputes `module` in backward: its BatchNorms normalize by the batch
    (training mode, the same computation and saved tensors as the forward's) with momentum 0,
    which leaves the running mean and variance as they are, and their batch count is put back:
    the forward already counted and averaged this batch."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    kept = [(m.momentum, m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(norms, kept):
            m.momentum = momentum
            with torch.no_grad():
                m.num_batches_tracked.copy_(tracked)
