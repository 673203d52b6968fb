"""More hand-written CNNs users compile (random weights; the architectures of torchvision's
EfficientNet-B0, DenseNet-121 and ResNeXt-50 32x4d, and a small U-Net): SiLU and sigmoid epilogues,
squeeze-and-excitation blocks, 5x5 depthwise convolutions, group norm, transposed convolutions,
bilinear / nearest upsampling, skip concatenations, and DenseNet's pre-activation layers (batch
norm and ReLU before each conv), growing concatenations and average-pooled transitions."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:
    from .cnn_defs import ResNet50, randomize_bn      # imported as tests.models.more_defs (benchmarks/models.py)
except ImportError:
    from cnn_defs import ResNet50, randomize_bn       # imported by pytest from tests/models


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeezed: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class MBConv(nn.Module):
    """Inverted residual with squeeze-and-excitation (a quarter of the block's input channels)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU()]
        layers += [nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.SiLU(),
                   SqueezeExcite(mid, max(1, cin // 4)), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class EfficientNetB0(nn.Module):
    #: (expansion, output channels, repeats, stride, kernel) per stage (Tan & Le, 2019)
    STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
              (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
        cin = 32
        for e, c, n, s, k in self.STAGES:
            for i in range(n):
                layers.append(MBConv(cin, c, k, s if i == 0 else 1, e))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.ReLU())


class UNet(nn.Module):
    """Three levels down, up by a transposed convolution, bilinear and nearest upsampling."""

    def __init__(self, cin: int = 3, classes: int = 2, base: int = 32) -> None:
        super().__init__()
        self.d1, self.d2 = _double_conv(cin, base), _double_conv(base, base * 2)
        self.d3, self.mid = _double_conv(base * 2, base * 4), _double_conv(base * 4, base * 4)
        self.up = nn.ConvTranspose2d(base * 4, base * 4, 2, stride=2)
        self.u3, self.u2 = _double_conv(base * 8, base * 2), _double_conv(base * 4, base)
        self.u1, self.out = _double_conv(base * 2, base), nn.Conv2d(base, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.d1(x)
        x2 = self.d2(F.max_pool2d(x1, 2))
        x3 = self.d3(F.max_pool2d(x2, 2))
        y = self.u3(torch.cat([self.up(self.mid(F.max_pool2d(x3, 2))), x3], 1))
        y = self.u2(torch.cat([F.interpolate(y, scale_factor=2, mode="bilinear"), x2], 1))
        y = self.u1(torch.cat([F.interpolate(y, scale_factor=2, mode="nearest"), x1], 1))
        return self.out(y)


class _DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv (to 4 x growth), BN-ReLU-3x3 conv (to growth), on every earlier feature."""

    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2, self.conv2 = nn.BatchNorm2d(4 * growth), nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(F.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(F.relu(self.norm2(x)))


class DenseNet121(nn.Module):
    """torchvision's densenet121: growth 32, blocks of 6 / 12 / 24 / 16 layers, transitions
    (BN-ReLU-1x1 conv halving the channels, 2x2 / 2 average pool) between them."""

    def __init__(self, classes: int = 1000, growth: int = 32, blocks: tuple[int, ...] = (6, 12, 24, 16)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        c = 64
        self.blocks, self.transitions = nn.ModuleList(), nn.ModuleList()
        for i, n in enumerate(blocks):
            self.blocks.append(nn.ModuleList(_DenseLayer(c + j * growth, growth) for j in range(n)))
            c += n * growth
            if i < len(blocks) - 1:
                self.transitions.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                                                      nn.AvgPool2d(2, 2)))
                c //= 2
        self.norm, self.classifier = nn.BatchNorm2d(c), nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, 1)
            if i < len(self.transitions):
                x = self.transitions[i](x)
        x = F.adaptive_avg_pool2d(F.relu(self.norm(x)), 1)
        return self.classifier(torch.flatten(x, 1))


def densenet121() -> nn.Module:
    return randomize_bn(DenseNet121()).eval()


def resnext50_32x4d() -> nn.Module:
    """torchvision's resnext50_32x4d: ResNet-50's blocks with 3x3 convs of 32 groups (4 to 32
    channels a group), twice as wide."""
    return randomize_bn(ResNet50(groups=32, width_per_group=4)).eval()


def efficientnet_b0() -> nn.Module:
    return randomize_bn(EfficientNetB0()).eval()


def unet() -> nn.Module:
    model = UNet()
    for m in model.modules():
        if isinstance(m, nn.GroupNorm):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model.eval()
