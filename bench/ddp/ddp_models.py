"""The models ``bench.ddp`` trains, sized for a 2-core machine.

Each takes a few hundred milliseconds per step on one core, and the three
cover the range of compute/communication balance:

| model | params | gradient | batch/rank | input |
| --- | --- | --- | --- | --- |
| resnet18 | 11.2 M | 42.7 MiB | 32 | 3x32x32 images, 10 classes (torchvision's ResNet-18, or a local one) |
| vgg | 59.6 M | 227 MiB | 8 | 3x32x32; VGG-11's convolutions, then 8192 -> 4096 -> 4096 -> 10 (the largest gradient, VGG's classifier) |
| transformer | 4.2 M | 16.1 MiB | 16 | 64 tokens of a 4096-word vocabulary; 4 encoder layers, d_model 256, 4 heads, FFN 1024 |

Compute per step is convolution- or matmul-bound like real training. vgg is
the communication-heavy one, as VGG-16 is in published scaling studies
(Horovod: 68% efficiency where ResNets get 90%): its 227 MiB gradient takes
about as long to all-reduce here as its batch of 8 takes to compute, the
balance of VGG-16 on GPUs over a 25 Gb/s network; resnet18 and transformer
are compute-bound (gradient time a small fraction of the step).
"""

from __future__ import annotations

import torch
from torch import nn

IMAGE_CLASSES = 10


class _BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convolutions and a shortcut), used when torchvision is absent."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def _local_resnet18(classes: int) -> nn.Module:
    """The ResNet-18 layout (stem, 4 stages of 2 basic blocks, 64..512 channels): same parameter count as torchvision's."""
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def resnet18_source() -> str:
    """'torchvision' when torchvision imports and works with this torch, else 'local'."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # ImportError, or a torchvision built for another torch (its operators fail to register)
        return "local"
    return "torchvision"


def resnet18() -> nn.Module:
    if resnet18_source() == "local":
        return _local_resnet18(IMAGE_CLASSES)
    import torchvision

    return torchvision.models.resnet18(num_classes=IMAGE_CLASSES)


def vgg() -> nn.Module:
    """VGG-11's 8 convolutions at 32x32 (4 pools, so the last maps are 2x2), an adaptive pool to 4x4 (as VGG
    pools to 7x7), and VGG's large classifier: 85% of the parameters are in the first two FC layers."""
    plan = [64, "pool", 128, "pool", 256, 256, "pool", 512, 512, "pool", 512, 512]
    layers, cin = [], 3
    for step in plan:
        if step == "pool":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, step, 3, padding=1), nn.ReLU(inplace=True)]
            cin = step
    layers += [nn.AdaptiveAvgPool2d(4), nn.Flatten(),
               nn.Linear(512 * 4 * 4, 4096), nn.ReLU(inplace=True),
               nn.Linear(4096, 4096), nn.ReLU(inplace=True),
               nn.Linear(4096, IMAGE_CLASSES)]
    return nn.Sequential(*layers)


class TextClassifier(nn.Module):
    """Token embedding + positional embedding, a TransformerEncoder, mean pooling, a linear head."""

    def __init__(self, vocab=4096, seq=64, d_model=256, heads=4, ffn=1024, layers=4, classes=IMAGE_CLASSES):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens):
        x = self.encoder(self.embed(tokens) + self.position)
        return self.head(x.mean(dim=1))


def transformer() -> nn.Module:
    return TextClassifier()


def _images(batch: int, generator: torch.Generator):
    return torch.randn(batch, 3, 32, 32, generator=generator), torch.randint(0, IMAGE_CLASSES, (batch,), generator=generator)


def _tokens(batch: int, generator: torch.Generator):
    return torch.randint(0, 4096, (batch, 64), generator=generator), torch.randint(0, IMAGE_CLASSES, (batch,), generator=generator)


# name -> (constructor, input maker, default batch per rank)
MODELS = {
    "resnet18": (resnet18, _images, 32),
    "vgg": (vgg, _images, 8),
    "transformer": (transformer, _tokens, 16),
}


def gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
