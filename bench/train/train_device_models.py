"""The models of ``python -m bench.train --device DEV``, by name and kind.

* image: ``resnet50`` (torchvision's, the default), ``resnet18``, ``tiny_cnn``
  (a two-layer CNN for smoke tests);
* video: ``r3d_50`` (a 3D ResNet-50, the family of Charades' baselines, the
  default), ``r3d_18`` (torchvision's), ``tiny_3d``;
* audio: ``audio_transformer`` (a small transformer over log-mel frames, the
  default), ``tiny_audio``.

torchvision has 3D ResNets of depth 18 only; ``r3d_50`` is its VideoResNet with
bottleneck blocks in ResNet-50's layout [3, 4, 6, 3] and full 3x3x3 convolutions
(Hara et al.'s 3D ResNet-50), built from torchvision's own video blocks.
"""

from __future__ import annotations

MODELS = {"image": ("resnet50", "resnet18", "tiny_cnn"), "video": ("r3d_50", "r3d_18", "tiny_3d"),
          "audio": ("audio_transformer", "tiny_audio")}


def r3d_50(num_classes: int):
    from dlop._torchvision_compat import import_torchvision

    import_torchvision()
    from torchvision.models.video.resnet import BasicStem, Bottleneck, Conv3DSimple, VideoResNet

    return VideoResNet(Bottleneck, [Conv3DSimple] * 4, [3, 4, 6, 3], BasicStem, num_classes=num_classes)


class AudioTransformer:
    """N x mels x frames -> N x classes: two strided 1-D convolutions (4x fewer frames), a transformer encoder,
    mean over the frames each sample really has (the batch is padded to its longest)."""

    @staticmethod
    def build(mels: int, classes: int, width: int, layers: int, heads: int):
        import torch
        from torch import nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.subsample = nn.Sequential(nn.Conv1d(mels, width, 3, stride=2, padding=1), nn.GELU(),
                                               nn.Conv1d(width, width, 3, stride=2, padding=1), nn.GELU())
                layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                   norm_first=True)
                self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
                self.head = nn.Linear(width, classes)

            def forward(self, features, lengths=None):
                x = self.subsample(features).transpose(1, 2)  # N x frames/4 x width
                if lengths is None:
                    return self.head(self.encoder(x).mean(1))
                kept = torch.div(lengths + 3, 4, rounding_mode="floor").clamp(min=1)
                pad = torch.arange(x.shape[1], device=x.device)[None, :] >= kept[:, None]
                x = self.encoder(x, src_key_padding_mask=pad).masked_fill(pad[..., None], 0)
                return self.head(x.sum(1) / kept[:, None].to(x.dtype))

        return Model()


def build(name: str, kind: str, classes: int, mels: int = 80):
    """The named model for `kind`, or ValueError naming the choices."""
    from torch import nn

    if name not in MODELS[kind]:
        raise ValueError(f"model {name!r} is not one for --kind {kind}: choose from {', '.join(MODELS[kind])}")
    if name in ("resnet50", "resnet18", "r3d_18"):
        from dlop._torchvision_compat import import_torchvision

        tv = import_torchvision()
        make = getattr(tv.models.video, name) if name == "r3d_18" else getattr(tv.models, name)
        return make(weights=None, num_classes=classes)
    if name == "r3d_50":
        return r3d_50(classes)
    if name == "tiny_cnn":
        return nn.Sequential(nn.Conv2d(3, 16, 5, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))
    if name == "tiny_3d":
        return nn.Sequential(nn.Conv3d(3, 16, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2)),
                             nn.ReLU(), nn.Conv3d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
                             nn.Linear(32, classes))
    if name == "tiny_audio":
        return AudioTransformer.build(mels, classes, width=32, layers=1, heads=2)
    return AudioTransformer.build(mels, classes, width=256, layers=4, heads=4)
