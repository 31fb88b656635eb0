"""The small models the lessons train, built locally (nothing is downloaded).

Each is deliberately tiny so that a lesson runs in seconds on a CPU, yet shaped like the real thing: an MLP
classifier (lessons 01, 02, 04), a model with a wide output layer like a language model's vocabulary head
(lesson 03), lesson 03's loss-in-forward module for its demos, and a model that reports what each replica receives
(lesson 01).
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from gpulab import virtual
from gpulab.messages import message


class MLP(nn.Module):
    """A two-layer perceptron: ``in_features -> hidden -> classes`` (lessons 01, 02 and 04)."""

    def __init__(self, in_features: int = 16, hidden: int = 32, classes: int = 4):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)


class WideHead(nn.Module):
    """A small body and a very wide output layer, like a big-vocabulary head (lesson 03).

    Its output (batch x classes) dwarfs everything else, which is what makes DataParallel's gathered output on
    device 0 visible in memory.
    """

    def __init__(self, in_features: int = 64, hidden: int = 128, classes: int = 50_000):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(inputs))


class ConvNet(nn.Module):
    """A VGG-style convolutional network for 3 x ``size`` x ``size`` images (lesson 03's compute-bound model).

    Convolutions reuse each weight at every pixel: billions of FLOPs per sample for a few million parameters, so
    a step computes far more than it moves. Lesson 03 builds it on the ``meta`` device (no memory, no compute)
    only to count its FLOPs and bytes for ``gpulab.scaling``'s prediction.
    """

    def __init__(self, width: int = 64, classes: int = 1000, size: int = 224):
        super().__init__()
        layers, channels = [], 3
        for out in (width, 2 * width, 4 * width, 8 * width, 8 * width):
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU(), nn.Conv2d(out, out, 3, padding=1)]
            layers += [nn.ReLU(), nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels * (size // 32) ** 2, classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(inputs).flatten(1))


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1, 3x3 (the stride, as in ResNet v1.5), 1x1 convolutions, each followed by BatchNorm,
    added to the block's input (projected by a strided 1x1 convolution where the shape changes)."""

    def __init__(self, channels: int, width: int, stride: int = 1):
        super().__init__()
        out = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(channels, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or channels != out:
            self.downsample = nn.Sequential(nn.Conv2d(channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(inputs)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (inputs if self.downsample is None else self.downsample(inputs)))


class ResNet50(nn.Module):
    """ResNet-50 as torchvision builds it (``torchvision.models.resnet50``: the stride in each block's 3x3
    convolution, "ResNet v1.5"), for 3 x 224 x 224 images (lesson 03).

    The model of the published multi-GPU measurements lesson 03 sets beside its predictions. Lesson 03 builds it
    on the ``meta`` device only, to count its FLOPs, operations and bytes (``gpulab.scaling.cost_on_meta``);
    ``tests/test_traffic.py`` holds it to torchvision's published size (25,557,032 parameters in 161 tensors).
    """

    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks, channels = [], 64
        for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for index in range(count):
                blocks.append(Bottleneck(channels, width, stride if index == 0 else 1))
                channels = 4 * width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(inputs))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(features, 1), 1))


class BatchNormMLP(nn.Module):
    """An MLP with BatchNorm between its layers: the exception to "DataParallel equals one big batch" (lesson 02)."""

    def __init__(self, in_features: int = 16, hidden: int = 32, classes: int = 4):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)


class ShapeReporter(nn.Module):
    """Wraps a model and records, for every call, where it ran and the shape it received (lesson 01).

    PyTorch's DataParallel tutorial prints this from inside ``forward``; here each call is also kept in
    ``calls`` as a dict ``{"device", "virtual_device", "thread", "shape"}`` (plus ``"samples"``, column 0 of
    the input, with ``record_samples=True``) so the lesson can tabulate and plot
    it. ``device`` is the tensor's real device (``cuda:1`` on real GPUs); ``virtual_device`` is the virtual
    device of the replica's thread (equal to the GPU index on real GPUs; see ``replica_device``).
    """

    def __init__(self, model: nn.Module, verbose: bool = True, record_samples: bool = False):
        super().__init__()
        self.model = model
        self.verbose = verbose
        self.record_samples = record_samples
        self.calls: list[dict] = []
        self._lock = threading.Lock()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        device = inputs.device
        index = replica_device(device)
        record = {
            "device": str(device),
            "virtual_device": index,
            "thread": threading.current_thread().name,
            "shape": tuple(inputs.shape),
        }
        if self.record_samples:
            # The lesson puts each sample's index in column 0, so the replica can say which samples it got.
            record["samples"] = [int(value) for value in inputs[:, 0].tolist()]
        with self._lock:
            self.calls.append(record)
        if self.verbose:
            print(message("models.replica_input", device=index, where=device, shape=tuple(inputs.shape)))
        return self.model(inputs)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_lock"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


def replica_device(device: torch.device) -> int:
    """The device a replica runs on, decided by the replica itself: the virtual device of its thread when it runs
    as one (``gpulab.virtual.on_virtual_device``, entered by every virtual replica), else the GPU its input is on
    (``nn.DataParallel``'s replica on ``cuda:k``), else 0.

    Not from the lesson's remembered choice: lesson 01's 4-device demo runs on 4 virtual devices backed by
    ``cuda:0`` on a 2- or 3-GPU machine while the lesson's choice is real GPUs, and every replica would then read
    ``cuda:0``'s index, 0. (Found by reading; ``tests/test_devices.py`` simulates that machine.)
    """
    here = virtual.thread_virtual_device()
    if here is not None:
        return here
    return device.index if device.type == "cuda" and device.index is not None else 0
