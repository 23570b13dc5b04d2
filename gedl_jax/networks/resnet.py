"""ResNet-18 in its CIFAR form, as the OpenOOD / TorchUncertainty benchmarks train it.

The kuangliu/pytorch-cifar network (`models/resnet.py`, which OpenOOD's `ResNet18_32x32` and
TorchUncertainty's CIFAR `resnet` with `style="cifar"` follow layer for layer):

    stem    Conv 3x3 / 1, 64, no bias -> BatchNorm -> ReLU        (no 7x7 conv, no max-pool)
    stage 1 BasicBlock(64,  stride 1) x 2                          32 x 32 on CIFAR
    stage 2 BasicBlock(128, stride 2) , BasicBlock(128) ...        16 x 16
    stage 3 BasicBlock(256, stride 2) , BasicBlock(256)             8 x 8
    stage 4 BasicBlock(512, stride 2) , BasicBlock(512)             4 x 4
    global average pool (kuangliu's avg_pool2d(4) on 32 x 32)  -> features (B, 512)
    Dense 512 -> K (with bias)                                 -> logits (B, K)

    BasicBlock(C, s): Conv 3x3 / s -> BN -> ReLU -> Conv 3x3 / 1 -> BN, plus the shortcut
    (identity, or Conv 1x1 / s + BN where the stride or the width changes), then ReLU.

Every conv has padding 1 (3x3) or 0 (1x1) and no bias; every BatchNorm has scale 1 and bias 0
at init, momentum 0.9 (flax's convention: PyTorch's momentum 0.1) and epsilon 1e-5. 11,173,962
parameters for K = 10 (tests/test_networks_resnet.py counts them layer by layer).

Interface (the user-network contract of `gedl_jax.networks.user`): `ResNet18(num_classes=K)`,
called as `module.apply(variables, images_BxHxWxC, train=bool)` -> float32 `logits_BxK`;
`method="features"` gives the pooled 512-d features instead. `train=True` normalises with the
batch statistics and updates the `batch_stats` collection (`mutable=["batch_stats"]`); with
`axis_name` set (e.g. "data" inside `jax.shard_map`) those statistics are averaged over that mesh
axis, i.e. computed on the global batch. Inputs are NHWC floats (any spatial size: the pool is
global); `dtype` is the compute dtype of convolutions and matmuls (parameters, batch statistics
and the returned logits/features stay float32).

Initialisation (`param_init`, as `gedl_jax.networks`): "torch" (the default: PyTorch's default
init, which the reference networks use, U(+-1/sqrt(fan_in)) for conv kernels, the Dense kernel
and the Dense bias) or "flax" (lecun_normal kernels, zero bias).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from gedl_jax.networks.layers import layer_inits

Dtype = Any
Initializer = Callable[..., jax.Array]

STAGE_WIDTHS = (64, 128, 256, 512)
BLOCKS_PER_STAGE = (2, 2, 2, 2)
BN_MOMENTUM = 0.9   # flax: running = momentum * running + (1 - momentum) * batch (PyTorch 0.1)
BN_EPSILON = 1e-5


def _kernel_init(param_init: str, fan_in: int) -> Initializer:
    return layer_inits(param_init, fan_in)[0]


class _ConvBN(nn.Module):
    """Conv (no bias) -> BatchNorm; padding (k - 1) // 2, as PyTorch's padding=1 for 3x3."""

    features: int
    kernel: int
    stride: int
    param_init: str
    axis_name: str | None
    dtype: Dtype

    @nn.compact
    def __call__(self, x_BxHxWxC: jax.Array, train: bool) -> jax.Array:
        pad = (self.kernel - 1) // 2
        fan_in = self.kernel * self.kernel * x_BxHxWxC.shape[-1]
        x = nn.Conv(self.features, (self.kernel, self.kernel), strides=(self.stride,) * 2,
                    padding=((pad, pad), (pad, pad)), use_bias=False, dtype=self.dtype,
                    param_dtype=jnp.float32,
                    kernel_init=_kernel_init(self.param_init, fan_in), name="conv")(x_BxHxWxC)
        return nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM,
                            epsilon=BN_EPSILON, axis_name=self.axis_name, dtype=self.dtype,
                            param_dtype=jnp.float32, name="bn")(x)


class BasicBlock(nn.Module):
    """relu(BN(conv3x3(relu(BN(conv3x3/s(x))))) + shortcut(x)); shortcut = conv1x1/s + BN when
    the stride is not 1 or the width changes (kuangliu's `BasicBlock`, expansion 1)."""

    features: int
    stride: int = 1
    param_init: str = "torch"
    axis_name: str | None = None
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BxHxWxC: jax.Array, train: bool) -> jax.Array:
        kw = dict(param_init=self.param_init, axis_name=self.axis_name, dtype=self.dtype)
        y = nn.relu(_ConvBN(self.features, 3, self.stride, name="conv_bn1", **kw)(x_BxHxWxC,
                                                                                  train))
        y = _ConvBN(self.features, 3, 1, name="conv_bn2", **kw)(y, train)
        shortcut = x_BxHxWxC
        if self.stride != 1 or x_BxHxWxC.shape[-1] != self.features:
            shortcut = _ConvBN(self.features, 1, self.stride, name="shortcut", **kw)(
                x_BxHxWxC, train)
        return nn.relu(y + shortcut)


class ResNet18(nn.Module):
    """CIFAR ResNet-18: `images_BxHxWxC` -> float32 `logits_BxK` (or the 512-d features).

    Attributes:
      num_classes: K, the width of the final Dense layer.
      dtype: compute dtype of convolutions and matmuls (e.g. jnp.bfloat16).
      axis_name: mesh axis over which BatchNorm averages batch statistics in training (e.g.
        "data" inside `jax.shard_map`); None on one device or outside shard_map.
      param_init: "torch" (PyTorch's default init, the reference's) or "flax".

    Parameter tree: stem {conv, bn}, stage{1..4}_block{1,2} {conv_bn1, conv_bn2[, shortcut]}
    (each {conv {kernel}, bn {scale, bias}}), head {kernel, bias}; batch_stats mirror the bn's.
    """

    num_classes: int = 10
    dtype: Dtype = jnp.float32
    axis_name: str | None = None
    param_init: str = "torch"

    @nn.compact
    def __call__(self, images_BxHxWxC: jax.Array, train: bool = False, *,
                 features: bool = False, both: bool = False):
        """Logits (B, K), or with `features=True` the pooled features (B, 512), float32.

        Args:
          images_BxHxWxC: NHWC float images (any H, W >= 8 keeps every stage non-empty).
          train: batch statistics (and their update) instead of the running averages.
          features: return the global-average-pooled features instead of the logits.
          both: return (features, logits) of this one pass.

        Returns:
          float32 `logits_BxK` or `features_Bx512`, or the pair.
        """
        kw = dict(param_init=self.param_init, axis_name=self.axis_name, dtype=self.dtype)
        x = nn.relu(_ConvBN(STAGE_WIDTHS[0], 3, 1, name="stem", **kw)(images_BxHxWxC, train))
        for stage, (width, blocks) in enumerate(zip(STAGE_WIDTHS, BLOCKS_PER_STAGE), start=1):
            for block in range(1, blocks + 1):
                stride = 2 if (stage > 1 and block == 1) else 1
                x = BasicBlock(width, stride, name=f"stage{stage}_block{block}", **kw)(x, train)
        features_BxF = jnp.mean(x.astype(jnp.float32), axis=(1, 2))   # global average pool
        if features:
            return features_BxF
        kernel_init, bias_init = layer_inits(self.param_init, features_BxF.shape[-1])
        logits_BxK = nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=jnp.float32,
                              kernel_init=kernel_init, bias_init=bias_init,
                              name="head")(features_BxF).astype(jnp.float32)
        return (features_BxF, logits_BxK) if both else logits_BxK

    def features(self, images_BxHxWxC: jax.Array, train: bool = False) -> jax.Array:
        """The pooled 512-d penultimate features (B, 512), float32: `module.apply(variables, x,
        train=..., method="features")` (the feature contract of `gedl_jax.networks.user`)."""
        return self(images_BxHxWxC, train=train, features=True)

    def features_and_logits(self, images_BxHxWxC: jax.Array, train: bool = False):
        """(features (B, 512), logits (B, K)) of one forward pass, so BatchNorm's statistics
        move once per training step where a method reads both (DAEDL, F-EDL)."""
        return self(images_BxHxWxC, train=train, both=True)
