"""MobileNetV2, written here so the plugin needs no torchvision.

Reference: Sandler, Howard, Zhu, Zhmoginov and Chen, "MobileNetV2: Inverted Residuals
and Linear Bottlenecks" (CVPR 2018), arXiv:1801.04381. Each block expands a thin
bottleneck with a 1x1 convolution, filters it with a depthwise 3x3 convolution (one
filter per channel: the depthwise separable factorization of MobileNetV1), and projects
it back with a 1x1 convolution that has no activation -- the "linear bottleneck", since
a ReLU in a low-dimensional space destroys information. The residual connection joins
the thin ends (an "inverted" residual). ReLU6 throughout, as the paper uses for
low-precision robustness. Layer layout and channel rounding follow the paper's Table 2 and
torchvision's implementation, so width 1.0 at 224x224 with 1000 classes has the
standard 3.50M parameters (3,504,872).
"""

from __future__ import annotations

from torch import nn

#: the paper's Table 2: expansion t, output channels c, repeats n, first stride s.
IMAGENET_LAYOUT = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                   (6, 320, 1, 1))
#: for 8x8 digits: a stride-1 stem and only two downsamplings (8 -> 4 -> 2), since the
#: ImageNet layout would shrink an 8x8 image to a single pixel after its second stage.
SMALL_LAYOUT = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 3, 2), (6, 96, 2, 1))
LAYOUTS = {"imagenet": (IMAGENET_LAYOUT, 2, 1280), "small": (SMALL_LAYOUT, 1, 512)}


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round channels to a multiple of 8 without going more than 10% below `value`
    (the rounding of the reference TensorFlow implementation)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def conv_bn_relu6(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = round(cin * expansion)
        layers = [conv_bn_relu6(cin, hidden, kernel=1)] if expansion != 1 else []
        layers += [conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),  # depthwise
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]  # linear bottleneck
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, in_chans: int = 3, width_mult: float = 1.0,
                 layout: str = "imagenet", dropout: float = 0.2) -> None:
        super().__init__()
        blocks, stem_stride, last = LAYOUTS[layout]
        cin = make_divisible(32 * width_mult)
        layers = [conv_bn_relu6(in_chans, cin, stride=stem_stride)]
        for t, c, n, s in blocks:
            cout = make_divisible(c * width_mult)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        self.last_channels = make_divisible(last * max(1.0, width_mult))  # never thinner than `last`
        layers.append(conv_bn_relu6(cin, self.last_channels, kernel=1))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.last_channels, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                # He init on the fan-in keeps activations at unit scale through all 17
                # blocks; torchvision's fan-out shrinks them ~6x per expansion, so an
                # untrained network (exported here for benchmarks) would output ~1e-9 and
                # its parity check would compare zeros.
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, image):
        x = nn.functional.adaptive_avg_pool2d(self.features(image), 1)
        return self.head(x.flatten(1))
