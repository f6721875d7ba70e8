"""ResNet18 for CIFAR-10 (kuangliu/pytorch-cifar): a 3x3 stride-1 stem and no max-pool, so
32x32 inputs keep their resolution into the first stage. 11,173,962 parameters with 10 outputs;
`num_classes` widens the output layer (the claims' memory study), each output adding
FEATURES + 1 parameters."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

FEATURES = 512   # width of the last stage, the input of the output layer


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 10):
        super().__init__()
        self.in_planes = 64
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = self._stage(64, blocks[0], 1)
        self.layer2 = self._stage(128, blocks[1], 2)
        self.layer3 = self._stage(256, blocks[2], 2)
        self.layer4 = self._stage(512, blocks[3], 2)
        self.linear = nn.Linear(FEATURES, num_classes)

    def _stage(self, planes: int, n: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (n - 1):
            layers.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


def resnet18(num_classes: int = 10) -> ResNet:
    """num_classes: outputs of the last layer (the labels may use fewer, as CIFAR-10's 0..9 do)."""
    return ResNet((2, 2, 2, 2), num_classes)
