"""The two parameter initialisations of the library networks (ResNet-18, MLP), by name.

The same choice as `config.init` and `gedl_jax.models.layer_inits` (kept separate here so the
new networks do not depend on where the protocol models live):

- "torch": PyTorch's default for nn.Conv2d / nn.Linear, kernel and bias
  U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform(a=sqrt(5)) gives exactly this bound);
  what the PyTorch reference networks start from.
- "flax": flax's defaults, lecun_normal kernels (variance 1/fan_in) and zero biases.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

INITS = ("torch", "flax")
Initializer = Callable[..., jax.Array]


def torch_uniform(fan_in: int) -> Initializer:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for any shape (the fan-in is given, not inferred,
    so the same initialiser serves kernels and biases)."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


def layer_inits(param_init: str, fan_in: int) -> tuple[Initializer, Initializer]:
    """(kernel_init, bias_init) of a conv or Dense layer with `fan_in` inputs per output.

    Args:
      param_init: "torch" or "flax" (see the module docstring).
      fan_in: kh * kw * C_in for a conv, the input width for a Dense layer.

    Returns:
      The kernel and bias initialisers.

    Raises:
      ValueError: for an unknown `param_init`.
    """
    if param_init not in INITS:
        raise ValueError(f"unknown param_init {param_init!r}; allowed: {', '.join(INITS)}")
    if param_init == "torch":
        return torch_uniform(fan_in), torch_uniform(fan_in)
    return nn.initializers.lecun_normal(), nn.initializers.zeros
