"""Built-in example models: random weights, nothing downloaded, deterministic for a seed.

The example models feed the tests, the benchmarks, ``remat demo`` and the CLI::

    from remat import models
    ex = models.build("resnet", size="small", seed=0)
    out = ex.model(*ex.args, **ex.kwargs)
    ex.loss(out).backward()
    models.names()     # ['mlp', 'dropout_mlp', 'cnn_bn', ...]

Every model is returned in ``train()`` mode and captures with
``torch.compile(ex.model, backend=..., fullgraph=True)`` without graph breaks.
The same ``(name, size, seed)`` gives the same weights and inputs on every call; building
does not disturb the caller's global RNG state.

Sizes:

- ``tiny``: gradient-equality tests; forward+backward in at most a few milliseconds (about 10
  for ``resnet50``, whose 53 convolutions are mostly per-op overhead at this size).
- ``small`` (default): memory tests; 30-60 MiB saved for backward, so that allocator noise of
  a few hundred KiB does not matter; a step takes 20-80 ms on two CPU cores.
- ``medium``: benchmarks; 120-250 MiB saved for backward; a step takes 0.1-0.4 s.

``distill`` is the exception in time: its frozen teacher (about 24 times the student's weights) runs in
every step, so its steps take several times as long, and its peak holds the teacher's working set.

Measured on torch 2.13 CPU, two cores, float32 (``python -m remat.models`` reprints it).
*saved* is what autograd keeps for the backward pass (storages of the tensors packed by
``saved_tensors_hooks``, each counted once, parameters and inputs excluded); *peak* is the
growth of the process's resident memory high-water mark over one eager forward+backward,
with ``.grad`` cleared first (it also holds temporaries and the gradients the step makes;
``-`` for tiny, whose small blocks never leave glibc's heap); *step* is the best of several
eager forward+backward times on an otherwise idle machine (2 threads).

=============  ======  ===========  ==========  ========
model          size    saved MiB    peak MiB    step ms
=============  ======  ===========  ==========  ========
mlp            tiny            0.0           -       0.1
mlp            small          40.0        48.0      73.4
mlp            medium        144.0       167.9     399.4
dropout_mlp    tiny            0.1           -       0.2
dropout_mlp    small          48.0        50.1      57.1
dropout_mlp    medium        192.0       199.9     339.1
cnn_bn         tiny            0.2           -       0.8
cnn_bn         small          33.0        34.8      17.8
cnn_bn         medium        222.8       234.1     175.6
inplace_views  tiny            0.1           -       0.4
inplace_views  small          39.0        52.5      53.0
inplace_views  medium        156.0       208.0     236.4
tied           tiny            0.2           -       0.4
tied           small          57.7        88.8      51.3
tied           medium        248.7       373.5     334.6
two_outputs    tiny            0.0           -       0.1
two_outputs    small          32.0        39.8      58.4
two_outputs    medium        120.0       143.9     330.5
resnet         tiny            0.2           -       2.0
resnet         small          33.5        35.1      24.3
resnet         medium        190.0       196.3     125.5
vgg11          tiny            0.2           -       1.5
vgg11          small          45.1        48.9      43.9
vgg11          medium        180.4       196.2     291.9
vgg16          tiny            0.4           -       3.1
vgg16          small          45.3        48.9      50.3
vgg16          medium        181.2       195.5     333.0
resnet18       tiny            0.1           -       3.2
resnet18       small          53.8        55.5      39.6
resnet18       medium        215.3       222.0     230.3
resnet50       tiny            0.2           -       9.9
resnet50       small          53.2        55.9      42.6
resnet50       medium        212.9       223.5     155.0
mobilenet      tiny            0.4           -       4.2
mobilenet      small          50.4        52.2      24.7
mobilenet      medium        201.3       209.1     131.5
unet           tiny            0.6           -       3.9
unet           small          40.8        51.4      30.8
unet           medium        163.3       188.2     130.5
densenet       tiny            0.3           -       2.0
densenet       small          31.8        32.1      23.9
densenet       medium        215.7       219.6     111.0
gpt2           tiny            2.4           -       2.8
gpt2           small          47.5        55.3      33.0
gpt2           medium        227.0       242.5     152.6
distill        tiny            2.9           -      22.1
distill        small          55.3        96.1     206.9
distill        medium        242.6       329.4     834.5
bert           tiny            1.7           -       2.7
bert           small          37.0        44.8      30.7
bert           medium        182.0       197.6     141.2
vit            tiny            0.6           -       1.7
vit            small          38.7        41.9      32.8
vit            medium        150.9       156.9     126.7
llama          tiny            1.8           -       2.8
llama          small          38.2        45.9      27.7
llama          medium        190.0       205.5     131.5
t5             tiny            3.3           -       7.3
t5             small          53.5        55.6      53.1
t5             medium        268.8       273.2     253.3
=============  ======  ===========  ==========  ========

Models, one module per family (each module's docstring describes its models):

- :mod:`.small`: ``mlp``, ``dropout_mlp``, ``cnn_bn``, ``inplace_views``, ``tied``,
  ``two_outputs``, small hand-written models that each exercise one thing a planner must handle
  (dropout, BatchNorm buffers, in-place ops and views, a tied weight, two outputs).
- :mod:`.resnet`: ``resnet``, a CIFAR-style ResNet of basic blocks, three stages.
- ``vgg11``, ``vgg16``, ``resnet18``, ``resnet50``, ``mobilenet``, ``unet``: the CNNs of
  Checkmate's (Jain et al., 2020) Table 2, written here (no torchvision) with the channel counts
  scaled down by a width multiplier and small images (32 or 64 px), in :mod:`.vgg`,
  :mod:`.resnet_imagenet`, :mod:`.mobilenet` and :mod:`.unet`.
- :mod:`.densenet`: ``densenet``, DenseNet-style dense blocks (every layer reads all earlier ones).
- :mod:`.hf`: ``gpt2``, ``distill`` (a GPT-2 student and its frozen teacher, run after it under
  ``no_grad``), ``bert``, ``vit``, ``llama``, ``t5`` (encoder-decoder), ``transformers`` models built from configs
  and wrapped in :class:`LossOnly` so the output is the scalar loss; they need the
  ``transformers`` package (``pip install remat[models]``).

:mod:`.registry` holds :class:`Example`, :func:`build` and :func:`names`. This package imports
nothing from the rest of remat.
"""

from __future__ import annotations

# isort: off
# Importing a family module registers its models: the order of these imports is the order of
# names(), so keep it (resnet18 and resnet50 come after the VGGs).
from .registry import _BUILDERS, _CONFIGS, SIZES, Example, build, names, register  # noqa: F401  (_BUILDERS, _CONFIGS: the tests read them)
from .layers import conv_bn, shortcut
from .small import CNN, MLP, InplaceViewBlock, InplaceViews, TiedLM, TwoOutputs
from .resnet import BasicBlock, ResNet
from .vgg import VGG
from .resnet_imagenet import Bottleneck, ImageNetResNet
from .mobilenet import MobileNet
from .unet import UNet, UNetUp
from .densenet import DenseLayer, DenseNet
from .hf import LossOnly, _gpt2, _transformers  # noqa: F401  (_gpt2, _transformers: the tests call them)
# isort: on

__all__ = ["Example", "SIZES", "build", "names", "register", "conv_bn", "shortcut", "LossOnly",
           "MLP", "CNN", "InplaceViewBlock", "InplaceViews", "TiedLM", "TwoOutputs", "BasicBlock", "ResNet", "VGG",
           "Bottleneck", "ImageNetResNet", "MobileNet", "UNet", "UNetUp", "DenseLayer", "DenseNet"]
