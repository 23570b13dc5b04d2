"""Flax models of the I-EDL / R-EDL protocol: the MNIST ConvNet and the CIFAR VGG16-bn.

Both follow `danruod/IEDL:code_classical/architectures/` layer for layer, with the reference
initialisation written out explicitly (spec: variants.md 8.1 and 10):

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

CPU performance (platform.md, "XLA on this CPU"; measured with `bin/profile_models.py`): two
layers have CPU-specific implementations, chosen per model by the `conv_impl` / `pool_impl`
attributes. `"auto"` (the default) uses them only when `jax.default_backend() == "cpu"`, so GPUs
run the plain path; every choice gives the same parameter tree (checkpoints are interchangeable)
and the same forward values up to float32 summation order.
- `conv_impl`: `"xla"` is `lax.conv_general_dilated` (what `nn.Conv` runs); `"im2col"` pads, slices
  the kh*kw shifted windows, concatenates them and does one matmul. `"auto"` uses im2col on CPU
  only for convolutions whose kernel is larger than their input (VGG's last block: 3x3 kernels on
  2x2 maps), which XLA's CPU backend otherwise moves off its fast convolution path (~100x slower).
  Elsewhere im2col is as slow or slower (up to ~3x per layer, forward + backward): not used.
- `pool_impl`: `"reduce_window"` is `nn.max_pool`; `"reshape"` crops to even size (floor, as
  PyTorch) and takes the max over a (2, 2) reshape, whose backward is much faster than
  select-and-scatter while its forward is slower; `"hybrid"` = reduce_window forward + an explicit
  reshape-style backward (custom VJP). `"auto"`: on CPU "reshape" when `train=True`, else
  "reduce_window" (the ConvNet and VGG16 pass their `train` flag to the pool).

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
import numpy as np

MODELS = ("convnet", "vgg16")
INITS = ("torch", "flax")
CONV_IMPLS = ("auto", "xla", "im2col")
POOL_IMPLS = ("auto", "reduce_window", "reshape", "hybrid")
DROPOUT_PLACEMENTS = ("dense", "all")

Dtype = Any
Initializer = Callable[..., jax.Array]

# ConvNet (`conv_hidden_dims`, `kernel_dim`, `hidden_dims` of the reference config).
CONVNET_CHANNELS = (64, 64, 64)
CONVNET_KERNEL = 5
CONVNET_HIDDEN = (64, 64, 64)
# vgg16_bn configuration "D": an int is a 3x3 conv with that many output channels, "M" a 2x2 pool.
VGG16_CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                512, 512, 512, "M")
VGG16_HIDDEN = (512, 512)


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


def _check_impl(impl: str, allowed: tuple[str, ...], what: str) -> None:
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
        _check_impl(self.impl, CONV_IMPLS, "conv_impl")
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


def max_pool_2x2(x_BxHxWxC: jax.Array, impl: str = "auto", *, train: bool = False) -> jax.Array:
    """2x2 / stride 2 max-pool with floor cropping of odd sizes (PyTorch `MaxPool2d(2)`).

    impl: "reduce_window" (`nn.max_pool`), "reshape" (crop + reshape + max), "hybrid"
    (reduce_window forward, explicit reshape-style backward) or "auto": on CPU "reshape" when
    `train` (its backward makes the ConvNet train step ~1.7x faster) and "reduce_window"
    otherwise (its forward is ~1.5x faster); "reduce_window" on other backends.
    All give the same forward. Their gradients agree unless a window holds tied maxima:
    reduce_window's select-and-scatter sends the gradient to one of them, the reshape and hybrid
    backwards split it evenly (after a ReLU such ties are zeros, whose gradient the ReLU discards).
    """
    _check_impl(impl, POOL_IMPLS, "pool_impl")
    if impl == "auto":
        impl = "reshape" if (train and _on_cpu()) else "reduce_window"
    return {"reduce_window": _pool_reduce_window, "reshape": _pool_reshape,
            "hybrid": _pool_hybrid}[impl](x_BxHxWxC)


def layer_inits(init: str, fan_in: int) -> tuple[Initializer, Initializer]:
    """(kernel_init, bias_init) of a ConvNet conv or any Dense layer under `init` (see `INITS`).

    "torch": PyTorch's default, kernel and bias U(+-1/sqrt(fan_in)) (the reference code's init).
    "flax": flax's default, lecun_normal kernel (variance 1/fan_in, 3x the uniform's 1/(3 fan_in))
    and zero bias.
    """
    _check_impl(init, INITS, "init")
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
    _check_impl(init, INITS, "init")
    if init == "torch":
        return vgg_conv_init, nn.initializers.zeros
    return flax_default_kernel_init(), nn.initializers.zeros


def _dense(features: int, fan_in: int, dtype: Dtype, name: str, init: str = "torch") -> nn.Dense:
    kernel_init, bias_init = layer_inits(init, fan_in)
    return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, name=name,
                    kernel_init=kernel_init, bias_init=bias_init)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
class ConvNet(nn.Module):
    """The I-EDL / R-EDL MNIST ConvNet; `images_BxHxWxC` in [0, 1] -> float32 `logits_BxK`.

    Parameter tree: conv0..conv2 {kernel (5, 5, C_in, 64), bias}, dense0..dense3 {kernel, bias}.
    The reference has no dropout and no BN; `dropout_rate` > 0 adds inverted dropout (rng stream
    "dropout") after the ReLU of every hidden Dense layer, and with `dropout_placement="all"`
    also after every conv ReLU (before its pool), as the reference's shared builder does with
    `p_drop` (MC Dropout; no parameters are added). Dropout is on when `dropout` is True (default:
    `train`). `train` also picks the faster CPU max-pool for a step that is differentiated (see
    `max_pool_2x2`).
    """

    num_classes: int = 10
    dtype: Dtype = jnp.float32
    conv_impl: str = "auto"
    pool_impl: str = "auto"
    param_init: str = "torch"
    dropout_rate: float = 0.0
    dropout_placement: str = "dense"

    @nn.compact
    def __call__(self, images_BxHxWxC: jax.Array, train: bool = False,
                 dropout: bool | None = None) -> jax.Array:
        _check_impl(self.dropout_placement, DROPOUT_PLACEMENTS, "dropout_placement")
        deterministic = not (train if dropout is None else dropout)

        def drop(x):
            if not self.dropout_rate:
                return x
            return nn.Dropout(self.dropout_rate, deterministic=deterministic)(x)

        x = images_BxHxWxC
        for i, channels in enumerate(CONVNET_CHANNELS):
            fan_in = CONVNET_KERNEL * CONVNET_KERNEL * x.shape[-1]
            kernel_init, bias_init = layer_inits(self.param_init, fan_in)
            x = Conv2D(channels, (CONVNET_KERNEL, CONVNET_KERNEL),
                       kernel_init=kernel_init, bias_init=bias_init,
                       impl=self.conv_impl, dtype=self.dtype, name=f"conv{i}")(x)
            x = nn.relu(x)
            if self.dropout_placement == "all":
                x = drop(x)
            x = max_pool_2x2(x, self.pool_impl, train=train)
        x = x.reshape(x.shape[0], -1)   # NHWC flatten order (h, w, c)
        for i, features in enumerate(CONVNET_HIDDEN):
            x = drop(nn.relu(_dense(features, x.shape[-1], self.dtype, f"dense{i}",
                                    self.param_init)(x)))
        logits = _dense(self.num_classes, x.shape[-1], self.dtype, f"dense{len(CONVNET_HIDDEN)}",
                        self.param_init)(x)
        return logits.astype(jnp.float32)


class VGG16(nn.Module):
    """vgg16_bn (configuration D) + the I-EDL classifier; `images_BxHxWxC` -> float32 `logits_BxK`.

    `train=True` uses batch statistics (and updates the "batch_stats" collection: call `apply` with
    `mutable=["batch_stats"]`) and dropout (rng stream "dropout"); `train=False` uses the running
    statistics and no dropout. `dropout` (default: `train`) turns the dropout on or off alone:
    MC Dropout predicts with `train=False, dropout=True`. With `axis_name` set (e.g. "data"
    inside `jax.shard_map`) the batch
    statistics are averaged over that mesh axis, i.e. computed on the global batch.

    Parameter tree: conv0..conv12 {kernel (3, 3, C_in, C_out), bias}, bn0..bn12 {scale, bias}
    (+ batch_stats bn0..bn12 {mean, var}), dense0..dense2 {kernel, bias}.
    """

    num_classes: int = 10
    dtype: Dtype = jnp.float32
    dropout_rate: float = 0.5
    axis_name: str | None = None
    conv_impl: str = "auto"
    pool_impl: str = "auto"
    param_init: str = "torch"

    @nn.compact
    def __call__(self, images_BxHxWxC: jax.Array, train: bool,
                 dropout: bool | None = None) -> jax.Array:
        deterministic = not (train if dropout is None else dropout)
        x = images_BxHxWxC
        conv_kernel_init, conv_bias_init = vgg_conv_inits(self.param_init)
        i = 0
        for v in VGG16_CONFIG:
            if v == "M":
                x = max_pool_2x2(x, self.pool_impl, train=train)
                continue
            x = Conv2D(v, (3, 3), kernel_init=conv_kernel_init, bias_init=conv_bias_init,
                       impl=self.conv_impl, dtype=self.dtype, name=f"conv{i}")(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                             axis_name=self.axis_name, dtype=self.dtype,
                             param_dtype=jnp.float32, name=f"bn{i}")(x)
            x = nn.relu(x)
            i += 1
        x = x.reshape(x.shape[0], -1)   # 512 for a 32x32 input (1x1 map)
        for j, features in enumerate(VGG16_HIDDEN):
            x = nn.Dropout(self.dropout_rate, deterministic=deterministic)(x)
            x = nn.relu(_dense(features, x.shape[-1], self.dtype, f"dense{j}", self.param_init)(x))
        logits = _dense(self.num_classes, x.shape[-1], self.dtype, f"dense{len(VGG16_HIDDEN)}",
                        self.param_init)(x)
        return logits.astype(jnp.float32)


def build_model(name: str, num_classes: int, dtype: Dtype = jnp.float32,
                axis_name: str | None = None, *, conv_impl: str = "auto",
                pool_impl: str = "auto", init: str = "torch", dropout_rate: float = 0.0,
                dropout_placement: str = "dense") -> nn.Module:
    """Returns the model called `name` (one of `MODELS`).

    `dropout_rate` / `dropout_placement`: the ConvNet's optional dropout (MC Dropout); VGG16's
    classifier dropout is part of the protocol architecture (0.5) and not changed by them.

    `init`: parameter initialisation, "torch" (the reference code's) or "flax" (flax's
    defaults); see `layer_inits` and `vgg_conv_inits`.

    `axis_name` is the mesh axis over which VGG16's BatchNorm averages batch statistics (the
    ConvNet has no BatchNorm and ignores it). `conv_impl` / `pool_impl`: see the module docstring.
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
