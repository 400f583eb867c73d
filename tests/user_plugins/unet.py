"""A user's plugin: a small U-Net for segmentation (two poolings, an upsampling and a skip
connection concatenated at each level), its height and width dynamic. Its forward takes
only sizes divisible by 4: at any other, the upsampled map and the skip it is
concatenated with differ by one row."""

import numpy as np
import torch

import zoo


def block(cin: int, cout: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.ReLU())


class UNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down1, self.down2, self.bottom = block(3, 8), block(8, 16), block(16, 16)
        self.up2, self.up1 = block(32, 8), block(16, 8)
        self.head = torch.nn.Conv2d(8, 2, 1)

    def forward(self, image):
        d1 = self.down1(image)
        d2 = self.down2(torch.nn.functional.max_pool2d(d1, 2))
        b = self.bottom(torch.nn.functional.max_pool2d(d2, 2))
        u2 = self.up2(torch.cat([torch.nn.functional.interpolate(b, scale_factor=2.0), d2], 1))
        u1 = self.up1(torch.cat([torch.nn.functional.interpolate(u2, scale_factor=2.0), d1], 1))
        return self.head(u1)


class PaddedUNet(UNet):
    """The same network, its input padded inside forward to the next multiple of 4 and
    its output cut back: every size in the range."""

    def forward(self, image):
        height, width = image.shape[-2:]
        padded = torch.nn.functional.pad(image, (0, (-width) % 4, 0, (-height) % 4))
        return super().forward(padded)[..., :height, :width]


class AlwaysPaddedUNet(UNet):
    """The same network padded by 1 to 4 rows and columns, never 0 (`4 - height % 4`): one
    path through the forward at every size, which torch.export can follow."""

    def forward(self, image):
        height, width = image.shape[-2:]
        padded = torch.nn.functional.pad(image, (0, 4 - width % 4, 0, 4 - height % 4))
        return super().forward(padded)[..., :height, :width]


@zoo.hookimpl
def zoo_register_models(register):
    for name, build in (("unet.tiny", UNet), ("unet.padded", PaddedUNet), ("unet.always", AlwaysPaddedUNet)):
        register(zoo.ModelSpec(
            name=name, domain="vision", task="segmentation",
            inputs=(zoo.TensorSpec("image", "float32", ("batch", 3, "height", "width")),),
            outputs=(zoo.TensorSpec("mask_logits", "float32", ("batch", 2, "height", "width")),),
            build=build,
            sample=lambda batch, rng: {"image": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)},
            axes={"batch": zoo.AxisRange(1, 2, 4), "height": zoo.AxisRange(16, 32, 128),
                  "width": zoo.AxisRange(16, 32, 128)}))
