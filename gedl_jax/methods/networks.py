"""Backbones for the non-EDL methods: the protocol ConvNet / VGG16 with named feature outputs and
optional spectral normalisation.

`Backbone` is `models.ConvNet` / `models.VGG16` layer for layer (same layer names, initialisers and
CPU implementations; without spectral norm its parameters are interchangeable with theirs, which
a test checks), returning a dict instead of the logits alone:

- "encoder": the flattened convolutional features (576 for the ConvNet on 28x28, 512 for VGG16 on
  32x32): DAEDL's density feature and F-EDL's head input;
- "hidden": the last hidden activation of the MLP (64 / 512): DUQ's feature;
- "logits": the final Dense layer (absent when `num_outputs` is 0).

`spectral_norm=True` wraps every conv and Dense layer in `nn.SpectralNorm` (one power iteration per
training forward, `update_stats=train`; the singular value of the kernel reshaped to
(kh*kw*C_in, C_out), which has the singular values of PyTorch's (C_out, C_in*kh*kw) view). The
power-iteration vectors live in the "batch_stats" collection, so a method threads them like
BatchNorm statistics. DAEDL and F-EDL's reference nets are spectrally normalised this way
(`torch.nn.utils.spectral_norm`, Lipschitz scale 1).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from gedl_jax import models

Dtype = Any


class Backbone(nn.Module):
    """The protocol ConvNet (`arch="convnet"`) or VGG16-bn (`"vgg16"`) with feature outputs.

    Attributes:
      arch: "convnet" or "vgg16".
      num_outputs: width of the final Dense layer ("logits"); 0 = none (a head-less encoder).
      hidden: MLP hidden widths; None = the protocol's (64, 64, 64) / (512, 512).
      spectral_norm: wrap every conv and Dense layer in spectral normalisation.
      dropout_rate: dropout before each hidden Dense layer (VGG16's protocol 0.5) or, for the
        ConvNet, after each hidden ReLU (MC Dropout's placement; 0 = none, the protocol).
      axis_name: mesh axis BatchNorm averages over (VGG16; None outside shard_map).
    """

    arch: str = "convnet"
    num_outputs: int = 10
    hidden: tuple[int, ...] | None = None
    spectral_norm: bool = False
    dropout_rate: float = 0.0
    axis_name: str | None = None
    dtype: Dtype = jnp.float32
    param_init: str = "torch"
    conv_impl: str = "auto"
    pool_impl: str = "auto"

    def _wrap(self, layer: nn.Module, name: str, train: bool):
        """The layer itself, or spectrally normalised (statistics updated only in training)."""
        if not self.spectral_norm:
            return layer
        sn = nn.SpectralNorm(layer, n_steps=1, name=f"sn_{name}")
        return lambda x: sn(x, update_stats=train)

    def _dense(self, features: int, fan_in: int, name: str, train: bool):
        kernel_init, bias_init = models.layer_inits(self.param_init, fan_in)
        return self._wrap(nn.Dense(features, dtype=self.dtype, param_dtype=jnp.float32,
                                   kernel_init=kernel_init, bias_init=bias_init, name=name),
                          name, train)

    @nn.compact
    def __call__(self, images_BxHxWxC: jax.Array, train: bool = False,
                 dropout: bool | None = None) -> dict[str, jax.Array]:
        if self.arch not in models.MODELS:
            raise ValueError(f"unknown arch {self.arch!r}; allowed: {', '.join(models.MODELS)}")
        deterministic = not (train if dropout is None else dropout)
        x = images_BxHxWxC
        if self.arch == "convnet":
            for i, channels in enumerate(models.CONVNET_CHANNELS):
                fan_in = models.CONVNET_KERNEL ** 2 * x.shape[-1]
                kernel_init, bias_init = models.layer_inits(self.param_init, fan_in)
                conv = models.Conv2D(channels, (models.CONVNET_KERNEL,) * 2,
                                     kernel_init=kernel_init, bias_init=bias_init,
                                     impl=self.conv_impl, dtype=self.dtype, name=f"conv{i}")
                x = nn.relu(self._wrap(conv, f"conv{i}", train)(x))
                x = models.max_pool_2x2(x, self.pool_impl, train=train)
            hidden = models.CONVNET_HIDDEN if self.hidden is None else self.hidden
        else:
            kernel_init, bias_init = models.vgg_conv_inits(self.param_init)
            i = 0
            for v in models.VGG16_CONFIG:
                if v == "M":
                    x = models.max_pool_2x2(x, self.pool_impl, train=train)
                    continue
                conv = models.Conv2D(v, (3, 3), kernel_init=kernel_init, bias_init=bias_init,
                                     impl=self.conv_impl, dtype=self.dtype, name=f"conv{i}")
                x = self._wrap(conv, f"conv{i}", train)(x)
                x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                                 axis_name=self.axis_name, dtype=self.dtype,
                                 param_dtype=jnp.float32, name=f"bn{i}")(x)
                x = nn.relu(x)
                i += 1
            hidden = models.VGG16_HIDDEN if self.hidden is None else self.hidden
        x = x.reshape(x.shape[0], -1)   # NHWC flatten order, as models.ConvNet
        out = {"encoder": x.astype(jnp.float32)}
        for j, features in enumerate(hidden):
            if self.arch == "vgg16" and self.dropout_rate:   # VGG: dropout before each Dense
                x = nn.Dropout(self.dropout_rate, deterministic=deterministic)(x)
            x = nn.relu(self._dense(features, x.shape[-1], f"dense{j}", train)(x))
            if self.arch == "convnet" and self.dropout_rate:  # ConvNet: after each hidden ReLU
                x = nn.Dropout(self.dropout_rate, deterministic=deterministic)(x)
        out["hidden"] = x.astype(jnp.float32)
        if self.num_outputs:
            out["logits"] = self._dense(self.num_outputs, x.shape[-1], f"dense{len(hidden)}",
                                        train)(x).astype(jnp.float32)
        return out


def backbone(config, num_outputs: int, *, axis_name: str | None, spectral_norm: bool = False,
             hidden: tuple[int, ...] | None = None, dropout_rate: float | None = None
             ) -> Backbone:
    """The config's protocol backbone (`config.model`) with the method's head width."""
    if dropout_rate is None:   # the protocol: VGG16's classifier dropout, none in the ConvNet
        dropout_rate = 0.5 if config.model == "vgg16" else float(config.get("dropout_rate", 0.0))
    return Backbone(arch=config.model, num_outputs=num_outputs, hidden=hidden,
                    spectral_norm=spectral_norm, dropout_rate=dropout_rate, axis_name=axis_name,
                    dtype=jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32,
                    param_init=config.get("init", "torch"))
