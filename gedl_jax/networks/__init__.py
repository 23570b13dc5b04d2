"""Networks: one definition of each, as Flax modules.

- `protocol`: the I-EDL / R-EDL protocol networks, the MNIST ConvNet and the CIFAR VGG16-bn, as
  one `Backbone` (logits, or the features methods such as DUQ and DAEDL need); `ConvNet` and
  `VGG16` are its logits form; `build_model` by name.
- `layers`: their convolution / max-pool implementations (CPU-specific paths) and initialisers.
"""

from gedl_jax.networks.layers import (
    CONV_IMPLS,
    DROPOUT_PLACEMENTS,
    INITS,
    POOL_IMPLS,
    Conv2D,
    conv_im2col,
    flax_default_kernel_init,
    layer_inits,
    max_pool_2x2,
    torch_default_init,
    vgg_conv_init,
    vgg_conv_inits,
)
from gedl_jax.networks.protocol import (
    CONVNET_CHANNELS,
    CONVNET_HIDDEN,
    CONVNET_KERNEL,
    MODELS,
    VGG16,
    VGG16_CONFIG,
    VGG16_HIDDEN,
    Backbone,
    ConvNet,
    build_model,
    model_flops_per_example,
    parameter_count,
)

__all__ = [
    "CONVNET_CHANNELS", "CONVNET_HIDDEN", "CONVNET_KERNEL", "CONV_IMPLS", "DROPOUT_PLACEMENTS",
    "INITS", "MODELS", "POOL_IMPLS", "VGG16", "VGG16_CONFIG", "VGG16_HIDDEN", "Backbone",
    "Conv2D", "ConvNet", "build_model", "conv_im2col", "flax_default_kernel_init",
    "layer_inits", "max_pool_2x2", "model_flops_per_example", "parameter_count",
    "torch_default_init", "vgg_conv_init", "vgg_conv_inits",
]
