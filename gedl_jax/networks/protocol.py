"""Flax models of the I-EDL / R-EDL protocol: the MNIST ConvNet and the CIFAR VGG16-bn.

Both follow `danruod/IEDL:code_classical/architectures/` layer for layer, with the reference
initialisation written out explicitly (PyTorch's layer defaults, which the reference keeps):

- `ConvNet` (MNIST): 3 x [Conv 5x5 SAME -> ReLU -> MaxPool 2x2/2], channels 64, 64, 64
  (28 -> 14 -> 7 -> 3, floor), flatten 576, MLP 576 -> 64 -> 64 -> 64 -> K. No dropout (MC Dropout
  adds it: `dropout_rate`), no BN.
  PyTorch default init everywhere: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
- `VGG16` (CIFAR): vgg16_bn configuration D; each conv 3x3 pad 1 -> BatchNorm -> ReLU; classifier
  Dropout -> Dense 512 -> ReLU -> Dropout -> Dense 512 -> ReLU -> Dense K. Conv weights
  N(0, sqrt(2 / (3*3*C_out))), conv bias 0; BN scale 1, bias 0, momentum 0.9 (= torch 0.1),
  eps 1e-5; Dense layers PyTorch default.

`param_init` (`config.init`) chooses the initialisation: "torch" is the reference's, above (the
models' default, bit for bit the parameters of every run made before the option existed);
"flax" is flax's defaults for every conv and Dense layer, lecun_normal kernels (variance
1/fan_in) and zero biases, VGG's convs included (BatchNorm unchanged). `config.init` defaults to
"flax": at 3 full-data MNIST epochs it detects OOD 3-7 AUPR points better (docs/reproduction.md).

Inputs are NHWC images in [0, 1] (the reference does no normalisation); outputs are float32 logits
`logits_BxK`. `dtype` is the compute dtype of convolutions and matmuls (e.g. bfloat16); parameters
and batch statistics stay float32.

Differences from the PyTorch reference, all harmless for training from scratch:
- The ConvNet flattens its 3x3x64 feature map in NHWC order (h, w, c), PyTorch in NCHW order
  (c, h, w): the first Dense kernel's rows are a fixed permutation of PyTorch's.
- PyTorch updates BatchNorm's running variance with the unbiased batch variance (x n/(n-1),
  n = B*H*W); flax uses the biased one. The smallest n is in VGG's last block (B*2*2: 256 at the
  reference batch size 64), so the running variance differs by <= 0.4 %.

The layers (CPU-specific convolution and pooling implementations, initialisers) are in
`gedl_jax.networks.layers`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax.networks.layers import (
    DROPOUT_PLACEMENTS,
    Conv2D,
    Dtype,
    check_choice,
    layer_inits,
    max_pool_2x2,
    vgg_conv_inits,
)

MODELS = ("convnet", "vgg16")

# ConvNet (`conv_hidden_dims`, `kernel_dim`, `hidden_dims` of the reference config).
CONVNET_CHANNELS = (64, 64, 64)
CONVNET_KERNEL = 5
CONVNET_HIDDEN = (64, 64, 64)
# vgg16_bn configuration "D": an int is a 3x3 conv with that many output channels, "M" a 2x2 pool.
VGG16_CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                512, 512, 512, "M")
VGG16_HIDDEN = (512, 512)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
class Backbone(nn.Module):
    """The protocol ConvNet (`arch="convnet"`) or VGG16-bn (`"vgg16"`): the one definition.

    `output="logits"` returns the float32 logits (B, `num_outputs`) alone, the form of `ConvNet`
    and `VGG16`; `output="features"` (the default) a dict, for methods that need more:

    - "encoder": the flattened convolutional features (576 for the ConvNet on 28x28, 512 for
      VGG16 on 32x32): DAEDL's density feature and F-EDL's head input;
    - "hidden": the last hidden activation of the MLP (64 / 512): DUQ's feature;
    - "logits": the final Dense layer (absent when `num_outputs` is 0).

    Parameter tree: ConvNet conv0..conv2 {kernel (5, 5, C_in, 64), bias}, dense0..dense3;
    VGG16 conv0..conv12, bn0..bn12 {scale, bias} (+ batch_stats bn0..bn12 {mean, var}),
    dense0..dense2. The same whatever the output form, so checkpoints are interchangeable.

    `spectral_norm=True` wraps every conv and Dense layer in `nn.SpectralNorm` (one power
    iteration per training forward, `update_stats=train`; the singular value of the kernel
    reshaped to (kh*kw*C_in, C_out), which has the singular values of PyTorch's
    (C_out, C_in*kh*kw) view). The power-iteration vectors live in the "batch_stats" collection,
    so a method threads them like BatchNorm statistics. DAEDL and F-EDL's reference nets are
    spectrally normalised this way (`torch.nn.utils.spectral_norm`, Lipschitz scale 1).

    `train=True` uses batch statistics (VGG16: call `apply` with `mutable=["batch_stats"]`) and
    dropout (rng stream "dropout"); `dropout` (default: `train`) turns the dropout on or off
    alone: MC Dropout predicts with `train=False, dropout=True`. With `axis_name` set (e.g.
    "data" inside `jax.shard_map`) BatchNorm's batch statistics are those of the global batch.
    `train` also picks the faster CPU max-pool for a step that is differentiated
    (`layers.max_pool_2x2`).

    Attributes:
      arch: "convnet" or "vgg16".
      num_outputs: width of the final Dense layer ("logits"); 0 = none (a head-less encoder).
      hidden: MLP hidden widths; None = the protocol's (64, 64, 64) / (512, 512).
      spectral_norm: wrap every conv and Dense layer in spectral normalisation.
      dropout_rate: VGG16: dropout before each hidden Dense layer (the protocol's 0.5); ConvNet:
        after each hidden ReLU (MC Dropout's placement; 0 = none, the protocol).
      dropout_placement: ConvNet only: "dense" (above) or "all", also after every conv ReLU
        (before its pool), as the reference's shared builder does with `p_drop`.
      axis_name: mesh axis BatchNorm averages over (VGG16; None outside shard_map).
      output: "features" (a dict) or "logits" (the logits array).
    """

    arch: str = "convnet"
    num_outputs: int = 10
    hidden: tuple[int, ...] | None = None
    spectral_norm: bool = False
    dropout_rate: float = 0.0
    dropout_placement: str = "dense"
    axis_name: str | None = None
    dtype: Dtype = jnp.float32
    param_init: str = "torch"
    conv_impl: str = "auto"
    pool_impl: str = "auto"
    output: str = "features"

    def _wrap(self, layer: nn.Module, name: str, train: bool):
        """The layer itself, or spectrally normalised (statistics updated only in training)."""
        if not self.spectral_norm:
            return layer
        sn = nn.SpectralNorm(layer, n_steps=1, name=f"sn_{name}")
        return lambda x: sn(x, update_stats=train)

    def _dense(self, features: int, fan_in: int, name: str, train: bool):
        kernel_init, bias_init = layer_inits(self.param_init, fan_in)
        return self._wrap(nn.Dense(features, dtype=self.dtype, param_dtype=jnp.float32,
                                   kernel_init=kernel_init, bias_init=bias_init, name=name),
                          name, train)

    def _drop(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if not self.dropout_rate:
            return x
        return nn.Dropout(self.dropout_rate, deterministic=deterministic)(x)

    def _convnet_features(self, x: jax.Array, train: bool, deterministic: bool) -> jax.Array:
        for i, channels in enumerate(CONVNET_CHANNELS):
            fan_in = CONVNET_KERNEL ** 2 * x.shape[-1]
            kernel_init, bias_init = layer_inits(self.param_init, fan_in)
            conv = Conv2D(channels, (CONVNET_KERNEL,) * 2, kernel_init=kernel_init,
                          bias_init=bias_init, impl=self.conv_impl, dtype=self.dtype,
                          name=f"conv{i}")
            x = nn.relu(self._wrap(conv, f"conv{i}", train)(x))
            if self.dropout_placement == "all":
                x = self._drop(x, deterministic)
            x = max_pool_2x2(x, self.pool_impl, train=train)
        return x

    def _vgg_features(self, x: jax.Array, train: bool) -> jax.Array:
        kernel_init, bias_init = vgg_conv_inits(self.param_init)
        i = 0
        for v in VGG16_CONFIG:
            if v == "M":
                x = max_pool_2x2(x, self.pool_impl, train=train)
                continue
            conv = Conv2D(v, (3, 3), kernel_init=kernel_init, bias_init=bias_init,
                          impl=self.conv_impl, dtype=self.dtype, name=f"conv{i}")
            x = self._wrap(conv, f"conv{i}", train)(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                             axis_name=self.axis_name, dtype=self.dtype,
                             param_dtype=jnp.float32, name=f"bn{i}")(x)
            x = nn.relu(x)
            i += 1
        return x

    @nn.compact
    def __call__(self, images_BxHxWxC: jax.Array, train: bool = False,
                 dropout: bool | None = None) -> dict[str, jax.Array] | jax.Array:
        check_choice(self.arch, MODELS, "arch")
        check_choice(self.dropout_placement, DROPOUT_PLACEMENTS, "dropout_placement")
        check_choice(self.output, ("features", "logits"), "output")
        deterministic = not (train if dropout is None else dropout)
        if self.arch == "convnet":
            x = self._convnet_features(images_BxHxWxC, train, deterministic)
            hidden = CONVNET_HIDDEN if self.hidden is None else self.hidden
        else:
            x = self._vgg_features(images_BxHxWxC, train)
            hidden = VGG16_HIDDEN if self.hidden is None else self.hidden
        x = x.reshape(x.shape[0], -1)   # NHWC flatten order (h, w, c)
        out = {"encoder": x.astype(jnp.float32)}
        for j, features in enumerate(hidden):
            if self.arch == "vgg16":   # VGG: dropout before each hidden Dense
                x = self._drop(x, deterministic)
            x = nn.relu(self._dense(features, x.shape[-1], f"dense{j}", train)(x))
            if self.arch == "convnet":   # ConvNet: after each hidden ReLU
                x = self._drop(x, deterministic)
        out["hidden"] = x.astype(jnp.float32)
        if self.num_outputs:
            out["logits"] = self._dense(self.num_outputs, x.shape[-1], f"dense{len(hidden)}",
                                        train)(x).astype(jnp.float32)
        return out["logits"] if self.output == "logits" else out


def ConvNet(num_classes: int = 10, dtype: Dtype = jnp.float32, conv_impl: str = "auto",  # noqa: N802
            pool_impl: str = "auto", param_init: str = "torch", dropout_rate: float = 0.0,
            dropout_placement: str = "dense") -> Backbone:
    """The I-EDL / R-EDL MNIST ConvNet, `images_BxHxWxC` in [0, 1] -> float32 `logits_BxK`: the
    `Backbone` with `arch="convnet"`, `output="logits"`.

    The reference has no dropout and no BN; `dropout_rate` > 0 adds inverted dropout (rng
    stream "dropout") after the ReLU of every hidden Dense layer, and with
    `dropout_placement="all"` also after every conv ReLU (MC Dropout; no parameters added).
    """
    return Backbone(arch="convnet", num_outputs=num_classes, dtype=dtype, conv_impl=conv_impl,
                    pool_impl=pool_impl, param_init=param_init, dropout_rate=dropout_rate,
                    dropout_placement=dropout_placement, output="logits")


def VGG16(num_classes: int = 10, dtype: Dtype = jnp.float32, dropout_rate: float = 0.5,  # noqa: N802
          axis_name: str | None = None, conv_impl: str = "auto", pool_impl: str = "auto",
          param_init: str = "torch") -> Backbone:
    """vgg16_bn (configuration D) + the I-EDL classifier, `images_BxHxWxC` -> float32
    `logits_BxK`: the `Backbone` with `arch="vgg16"`, `output="logits"`."""
    return Backbone(arch="vgg16", num_outputs=num_classes, dtype=dtype, dropout_rate=dropout_rate,
                    axis_name=axis_name, conv_impl=conv_impl, pool_impl=pool_impl,
                    param_init=param_init, output="logits")


def build_model(name: str, num_classes: int, dtype: Dtype = jnp.float32,
                axis_name: str | None = None, *, conv_impl: str = "auto",
                pool_impl: str = "auto", init: str = "torch", dropout_rate: float = 0.0,
                dropout_placement: str = "dense") -> nn.Module:
    """Returns the model called `name` (one of `MODELS`), as logits.

    `dropout_rate` / `dropout_placement`: the ConvNet's optional dropout (MC Dropout); VGG16's
    classifier dropout is part of the protocol architecture (0.5) and not changed by them.

    `init`: parameter initialisation, "torch" (the reference code's) or "flax" (flax's
    defaults); see `layers.layer_inits` and `layers.vgg_conv_inits`.

    `axis_name` is the mesh axis over which VGG16's BatchNorm averages batch statistics (the
    ConvNet has no BatchNorm and ignores it). `conv_impl` / `pool_impl`: see `layers`.
    """
    if name == "convnet":
        return ConvNet(num_classes=num_classes, dtype=dtype, conv_impl=conv_impl,
                       pool_impl=pool_impl, param_init=init, dropout_rate=dropout_rate,
                       dropout_placement=dropout_placement)
    if name == "vgg16":
        return VGG16(num_classes=num_classes, dtype=dtype, axis_name=axis_name,
                     conv_impl=conv_impl, pool_impl=pool_impl, param_init=init)
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")

# --------------------------------------------------------------------------------------------
# Analytic cost
# --------------------------------------------------------------------------------------------
def _layer_macs(name: str, image_shape: Sequence[int], num_classes: int):
    """Yields (output elements, multiply-adds per output element) of each conv / Dense layer."""
    h, w, c = image_shape
    if name == "convnet":
        for ch in CONVNET_CHANNELS:
            yield h * w * ch, CONVNET_KERNEL * CONVNET_KERNEL * c
            h, w, c = h // 2, w // 2, ch
        widths = (*CONVNET_HIDDEN, num_classes)
    elif name == "vgg16":
        for v in VGG16_CONFIG:
            if v == "M":
                h, w = h // 2, w // 2
            else:
                yield h * w * v, 9 * c
                c = v
        widths = (*VGG16_HIDDEN, num_classes)
    else:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")
    fan_in = h * w * c
    for f in widths:
        yield f, fan_in
        fan_in = f


def model_flops_per_example(name: str, image_shape: Sequence[int], num_classes: int = 10) -> int:
    """Forward FLOPs per example: 2 x the multiply-adds of the convolutions and Dense layers.

    Convolutions count every kernel tap (also those on the zero padding):
    H_out*W_out*C_out*kh*kw*C_in multiply-adds. Biases, BatchNorm, ReLU and pooling are not
    counted (< 1 %). A training step costs about 3x the forward (forward + input gradient +
    weight gradient; the first layer's input gradient is not needed).
    ConvNet at (28, 28, 1): 52,776,192; VGG16 at (32, 32, 3): 627,451,904.
    """
    macs = sum(out * per_out for out, per_out in _layer_macs(name, image_shape, num_classes))
    return 2 * int(macs)


def parameter_count(params: Any) -> int:
    """Number of scalars in a parameter pytree (the "params" collection, not batch_stats)."""
    return int(sum(np.prod(p.shape) for p in jax.tree_util.tree_leaves(params)))
