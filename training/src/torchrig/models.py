"""The two models: a small CNN and torchvision's ResNet-18 adapted to small images."""

from __future__ import annotations

from torch import nn

from .data import import_torchvision


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks and a classifier: about 0.2M parameters, any input size."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * side * side, 128), nn.ReLU(), nn.Linear(128, num_classes)
        )

    def forward(self, x):
        return self.classifier(self.features(x))


def resnet18(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    tv = import_torchvision("--model resnet18")
    model = tv.models.resnet18(weights=None, num_classes=num_classes)
    if image_size <= 64:
        # The ImageNet stem (7x7 stride 2 + max-pool) would shrink a 28 or 32 px image to
        # 7-8 px before the first block; the usual CIFAR stem keeps the resolution.
        model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model


def build_model(name: str, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    if name == "cnn":
        return SmallCNN(in_channels, num_classes, image_size)
    return resnet18(in_channels, num_classes, image_size)
