"""Layers of the protocol networks: convolution and max-pool implementations, initialisers.

Performance (CPU measured with `studies/profile_models.py`, docs/performance.md; GPU with
`bin/benchmark.py --pool_impl`): two layers have backend-specific implementations, chosen per
model by the `conv_impl` / `pool_impl` attributes. `"auto"` (the default) picks im2col
convolutions only when `jax.default_backend() == "cpu"`, and the max-pool's training gradient
per backend (below); every choice gives the same parameter tree (checkpoints are
interchangeable) and the same forward values up to float32 summation order.
- `conv_impl`: `"xla"` is `lax.conv_general_dilated` (what `nn.Conv` runs); `"im2col"` pads, slices
  the kh*kw shifted windows, concatenates them and does one matmul. `"auto"` uses im2col on CPU
  only for convolutions whose kernel is larger than their input (VGG's last block: 3x3 kernels on
  2x2 maps), which XLA's CPU backend otherwise moves off its fast convolution path (~100x slower).
  Elsewhere im2col is as slow or slower (up to ~3x per layer, forward + backward): not used.
- `pool_impl`: `"reduce_window"` is `nn.max_pool`; `"reshape"` crops to even size (floor, as
  PyTorch) and takes the max over a (2, 2) reshape, whose backward is much faster than
  select-and-scatter while its forward is slower; `"hybrid"` = reduce_window forward + an explicit
  reshape-style backward (custom VJP). `"auto"`: when `train=True`, "reshape" on CPU and
  "hybrid" elsewhere; "reduce_window" otherwise (the ConvNet and VGG16 pass their `train` flag to
  the pool). On a GPU under deterministic kernels (`config.deterministic`, the default)
  reduce_window's gradient, a select-and-scatter, is what makes the step slow: an H200 ran the
  ConvNet step (batch 128, TF32) in 1.62 ms with it, 0.85 ms with "hybrid" and 0.69 ms with it
  under XLA's fastest, non-deterministic kernels (docs/results/gpu/nvidia_h200/). Every train
  choice but "reduce_window" splits a tied maximum's gradient evenly, so a CPU and a GPU run
  follow the same rule.

Measured img/s on the project's 2-core CPU (jax 0.10.2, float32; best round of interleaved
medians, the machine is shared so rounds vary by up to 2x; PyTorch 2.13 with 2 threads on the same
machine, same architectures, softplus-MSE loss and Adam). Train: one jitted step (forward,
backward, Adam), batch 128. Eval: forward with train=False, batch 1024 (*: batch 256).

    conv_impl / pool_impl                 ConvNet train  eval     VGG16 train  eval
    xla / reduce_window  (plain flax)         ~600      ~7,000         ~15      ~41*
    xla / reshape                            ~1,030     ~4,500         ~19
    auto / reduce_window                                                ~88     ~310
    auto / reshape                                                      ~94     ~210
    auto / hybrid                              ~920     ~7,100          ~96     ~310
    auto / auto  (the default)               ~1,030     ~7,000          ~94     ~310
    PyTorch reference                     ~1,120-1,310  ~1,800         ~154     ~310

(For the ConvNet "auto" conv is "xla": no kernel is larger than its input.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

INITS = ("torch", "flax")
CONV_IMPLS = ("auto", "xla", "im2col")
POOL_IMPLS = ("auto", "reduce_window", "reshape", "hybrid")
DROPOUT_PLACEMENTS = ("dense", "all")

Dtype = Any
Initializer = Callable[..., jax.Array]


# --------------------------------------------------------------------------------------------
# Initialisers
# --------------------------------------------------------------------------------------------
def torch_default_init(fan_in: int) -> Initializer:
    """PyTorch's default Linear/Conv init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

    kaiming_uniform(a=sqrt(5)) gives exactly this bound for weights, and PyTorch draws the bias
    from the same interval. The bias shape does not carry the fan-in, so it is passed explicitly.
    """
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: Sequence[int], dtype: Dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


def flax_default_kernel_init() -> Initializer:
    """flax's default kernel init of `nn.Dense` / `nn.Conv`: lecun_normal.

    A truncated normal (cut at 2 standard deviations, rescaled) with variance 1/fan_in, where
    fan_in is the product of all kernel axes but the last (kh*kw*C_in for an HWIO kernel).
    Its bias partner is `nn.initializers.zeros`.
    """
    return nn.initializers.lecun_normal()


def vgg_conv_init(key: jax.Array, shape: Sequence[int], dtype: Dtype = jnp.float32) -> jax.Array:
    """VGG conv weights N(0, sqrt(2 / (kh*kw*C_out))) for an HWIO kernel.

    As the reference `_initialize_weights` (n = kh*kw*out_channels; normal_(0, sqrt(2/n))).
    """
    kh, kw, _, c_out = shape
    return math.sqrt(2.0 / (kh * kw * c_out)) * jax.random.normal(key, shape, dtype)


# --------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------
def _on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def check_choice(impl: str, allowed: tuple[str, ...], what: str) -> None:
    if impl not in allowed:
        raise ValueError(f"unknown {what} {impl!r}; allowed: {', '.join(allowed)}")


def conv_im2col(x_BxHxWxC: jax.Array, kernel_HxWxIxO: jax.Array,
                padding: Sequence[tuple[int, int]]) -> jax.Array:
    """Stride-1 convolution as im2col + one matmul; same result as `lax.conv_general_dilated`.

    The kh*kw shifted windows of the padded input are concatenated along channels in (dy, dx, c)
    order, which is the row order of the HWIO kernel reshaped to (kh*kw*C_in, C_out).
    """
    kh, kw, c_in, c_out = kernel_HxWxIxO.shape
    (pt, pb), (pl, pr) = padding
    xp = jnp.pad(x_BxHxWxC, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    ho = xp.shape[1] - kh + 1
    wo = xp.shape[2] - kw + 1
    patches = jnp.concatenate(
        [xp[:, dy:dy + ho, dx:dx + wo, :] for dy in range(kh) for dx in range(kw)], axis=-1)
    return jnp.dot(patches, kernel_HxWxIxO.reshape(kh * kw * c_in, c_out))


class Conv2D(nn.Module):
    """Stride-1 'SAME' convolution with an `nn.Conv`-compatible parameter tree (kernel HWIO, bias).

    Attributes:
      features: output channels.
      kernel_size: (kh, kw), odd.
      kernel_init, bias_init: initialisers.
      impl: "xla", "im2col" or "auto" (im2col on CPU when the kernel is larger than the input).
      dtype: compute dtype; param_dtype: parameter dtype.
    """

    features: int
    kernel_size: tuple[int, int]
    kernel_init: Initializer
    bias_init: Initializer
    impl: str = "auto"
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BxHxWxC: jax.Array) -> jax.Array:
        check_choice(self.impl, CONV_IMPLS, "conv_impl")
        kh, kw = self.kernel_size
        kernel = self.param("kernel", self.kernel_init,
                            (kh, kw, x_BxHxWxC.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
        x, kernel, bias = nn.dtypes.promote_dtype(x_BxHxWxC, kernel, bias, dtype=self.dtype)
        padding = ((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2)
        if self.use_im2col(x.shape[1:3]):
            y = conv_im2col(x, kernel, padding)
        else:
            y = jax.lax.conv_general_dilated(
                x, kernel, window_strides=(1, 1), padding=padding,
                dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + bias.reshape(1, 1, 1, -1)

    def use_im2col(self, spatial_HxW: Sequence[int]) -> bool:
        """Whether this convolution runs as im2col + matmul for inputs of `spatial_HxW`:
        `impl="im2col"`, or `impl="auto"` on a CPU where the kernel is larger than the input."""
        if self.impl == "auto":
            kernel_larger = any(s < k for s, k in zip(spatial_HxW, self.kernel_size))
            return _on_cpu() and kernel_larger
        return self.impl == "im2col"


def _pool_reshape(x_BxHxWxC: jax.Array) -> jax.Array:
    b, h, w, c = x_BxHxWxC.shape
    ho, wo = h // 2, w // 2
    x = x_BxHxWxC[:, :2 * ho, :2 * wo, :]   # floor, as PyTorch's MaxPool2d(2) (7 -> 3)
    return x.reshape(b, ho, 2, wo, 2, c).max(axis=(2, 4))


def _pool_reduce_window(x_BxHxWxC: jax.Array) -> jax.Array:
    return nn.max_pool(x_BxHxWxC, (2, 2), strides=(2, 2), padding="VALID")


@jax.custom_vjp
def _pool_hybrid(x_BxHxWxC: jax.Array) -> jax.Array:
    return _pool_reduce_window(x_BxHxWxC)


def _pool_hybrid_fwd(x_BxHxWxC):
    y = _pool_reduce_window(x_BxHxWxC)
    return y, (x_BxHxWxC, y)


def _pool_hybrid_bwd(residuals, g_BxHoxWoxC):
    """The gradient of `_pool_reshape` (ties share it evenly), from the stored input and output."""
    x, y = residuals
    b, h, w, c = x.shape
    ho, wo = h // 2, w // 2
    x6 = x[:, :2 * ho, :2 * wo, :].reshape(b, ho, 2, wo, 2, c)
    is_max = x6 == y[:, :, None, :, None, :]
    count = is_max.sum(axis=(2, 4), keepdims=True).astype(g_BxHoxWoxC.dtype)
    g6 = jnp.where(is_max, g_BxHoxWoxC[:, :, None, :, None, :] / count, 0)
    gx = g6.reshape(b, 2 * ho, 2 * wo, c).astype(x.dtype)
    return (jnp.pad(gx, ((0, 0), (0, h - 2 * ho), (0, w - 2 * wo), (0, 0))),)


_pool_hybrid.defvjp(_pool_hybrid_fwd, _pool_hybrid_bwd)


def pool_choice(impl: str, train: bool) -> str:
    """The implementation `max_pool_2x2` runs for `impl` ("auto" resolved on this backend)."""
    check_choice(impl, POOL_IMPLS, "pool_impl")
    if impl != "auto":
        return impl
    if not train:
        return "reduce_window"   # its forward is the fastest on every backend measured
    return "reshape" if _on_cpu() else "hybrid"


def max_pool_2x2(x_BxHxWxC: jax.Array, impl: str = "auto", *, train: bool = False) -> jax.Array:
    """2x2 / stride 2 max-pool with floor cropping of odd sizes (PyTorch `MaxPool2d(2)`).

    impl: "reduce_window" (`nn.max_pool`), "reshape" (crop + reshape + max), "hybrid"
    (reduce_window forward, explicit reshape-style backward) or "auto" (`pool_choice`): when
    `train`, "reshape" on CPU (its backward makes the ConvNet train step ~1.7x faster) and
    "hybrid" elsewhere (on a GPU with deterministic kernels ~1.9x faster than reduce_window's
    select-and-scatter gradient); "reduce_window" otherwise (its forward is ~1.5x faster on CPU).
    All give the same forward. Their gradients agree unless a window holds tied maxima:
    reduce_window's select-and-scatter sends the gradient to one of them, the reshape and hybrid
    backwards split it evenly (after a ReLU such ties are zeros, whose gradient the ReLU discards).
    """
    return {"reduce_window": _pool_reduce_window, "reshape": _pool_reshape,
            "hybrid": _pool_hybrid}[pool_choice(impl, train)](x_BxHxWxC)


def layer_inits(init: str, fan_in: int) -> tuple[Initializer, Initializer]:
    """(kernel_init, bias_init) of a ConvNet conv or any Dense layer under `init` (see `INITS`).

    "torch": PyTorch's default, kernel and bias U(+-1/sqrt(fan_in)) (the reference code's init).
    "flax": flax's default, lecun_normal kernel (variance 1/fan_in, 3x the uniform's 1/(3 fan_in))
    and zero bias.
    """
    check_choice(init, INITS, "init")
    if init == "torch":
        return torch_default_init(fan_in), torch_default_init(fan_in)
    return flax_default_kernel_init(), nn.initializers.zeros


def vgg_conv_inits(init: str) -> tuple[Initializer, Initializer]:
    """(kernel_init, bias_init) of a VGG conv under `init`.

    "torch": the reference's own `_initialize_weights`, N(0, sqrt(2/(kh*kw*C_out))) and zero bias
    (this is not PyTorch's default, so the name means "as the PyTorch reference code").
    "flax": what a plain `nn.Conv` gets, lecun_normal and zero bias. Each conv is followed by a
    BatchNorm, so the conv kernel's scale does not change the forward pass at initialisation.
    """
    check_choice(init, INITS, "init")
    if init == "torch":
        return vgg_conv_init, nn.initializers.zeros
    return flax_default_kernel_init(), nn.initializers.zeros
