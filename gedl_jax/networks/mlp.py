"""A multilayer perceptron for vector inputs (tabular data, embeddings) or flattened images.

    MLP(num_classes=K, hidden=(256, 256), dropout_rate=0.0)

    x (B, D), or (B, H, W, C) flattened to (B, H*W*C)
    [Dense -> ReLU -> Dropout] per hidden width          -> features (B, hidden[-1])
    Dense -> K                                           -> logits (B, K)

Interface (the user-network contract of `gedl_jax.networks.user`): called as
`module.apply(variables, x, train=bool)` -> float32 `logits_BxK`; `method="features"` gives the
last hidden activation (the input of the final Dense layer: after the ReLU and, in training, the
dropout, as `gedl_jax.networks.Backbone`'s "hidden"; the flattened input when `hidden`
is empty). Dropout (inverted, rate `dropout_rate`, after every hidden ReLU, the ConvNet's MC
Dropout placement) is on when `train` is True (or `dropout=True`: MC Dropout) and draws from the
"dropout" rng stream. No
BatchNorm, so no `batch_stats` and no `axis_name`.

Initialisation (`param_init`, as `gedl_jax.networks`): "flax" (the default: lecun_normal kernels,
zero biases) or "torch" (PyTorch's nn.Linear default, U(+-1/sqrt(fan_in)) kernels and biases).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from gedl_jax.networks.layers import layer_inits

Dtype = Any


def _dense(features: int, fan_in: int, param_init: str, dtype: Dtype, name: str) -> nn.Dense:
    kernel_init, bias_init = layer_inits(param_init, fan_in)
    return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, kernel_init=kernel_init,
                    bias_init=bias_init, name=name)


class MLP(nn.Module):
    """`x_BxD` (or images, flattened) -> float32 `logits_BxK` (or the last hidden activation).

    Attributes:
      num_classes: K, the width of the final Dense layer.
      hidden: the hidden widths, in order; () = a linear classifier.
      dropout_rate: dropout after every hidden ReLU in training (0 = none).
      dtype: compute dtype of the matmuls; parameters and outputs stay float32.
      param_init: "flax" (lecun_normal, zero bias) or "torch" (U(+-1/sqrt(fan_in))).

    Parameter tree: dense0..dense{len(hidden)-1} {kernel, bias}, head {kernel, bias}.
    """

    num_classes: int = 10
    hidden: tuple[int, ...] = (256, 256)
    dropout_rate: float = 0.0
    dtype: Dtype = jnp.float32
    param_init: str = "flax"

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False, *, features: bool = False,
                 dropout: bool | None = None, both: bool = False):
        """Logits (B, K), or with `features=True` the last hidden activation, float32.

        Args:
          x: (B, D) vectors or (B, ...) arrays, flattened to (B, D).
          train: dropout on (from the "dropout" rng stream).
          features: return the input of the final Dense layer instead of the logits.
          dropout: dropout on or off regardless of `train` (MC Dropout: train=False,
            dropout=True); None follows `train`.
          both: return (features, logits) of this one pass.

        Returns:
          float32 `logits_BxK` or `features_BxF` (F = hidden[-1], or D without hidden layers),
          or the pair.
        """
        h_BxF = x.reshape(x.shape[0], -1)
        for i, width in enumerate(self.hidden):
            h_BxF = nn.relu(_dense(width, h_BxF.shape[-1], self.param_init, self.dtype,
                                   f"dense{i}")(h_BxF))
            if self.dropout_rate:
                h_BxF = nn.Dropout(self.dropout_rate, deterministic=not (
                    train if dropout is None else dropout))(h_BxF)
        if features:
            return h_BxF.astype(jnp.float32)
        logits_BxK = _dense(self.num_classes, h_BxF.shape[-1], self.param_init, self.dtype,
                            "head")(h_BxF).astype(jnp.float32)
        return (h_BxF.astype(jnp.float32), logits_BxK) if both else logits_BxK

    def features(self, x: jax.Array, train: bool = False) -> jax.Array:
        """The last hidden activation (B, F), float32: `module.apply(variables, x, train=...,
        method="features")` (the feature contract of `gedl_jax.networks.user`)."""
        return self(x, train=train, features=True)

    def features_and_logits(self, x: jax.Array, train: bool = False):
        """(features (B, F), logits (B, K)) of one forward pass: what DAEDL and F-EDL read
        (`networks.user`'s one-pass contract)."""
        return self(x, train=train, both=True)
