"""The optimiser of every method: Adam with a cosine (or constant) learning rate."""

from __future__ import annotations

import optax


def make_optimizer(config, total_steps: int) -> optax.GradientTransformation:
    """Adam with a cosine (or constant) learning rate and L2 or decoupled weight decay.

    "l2" adds wd * params to the gradient before Adam's moments, which is what PyTorch's
    `Adam(weight_decay=...)` in the reference code does; "decoupled" is AdamW.
    """
    if config.lr_schedule == "cosine":
        lr = optax.cosine_decay_schedule(config.learning_rate, decay_steps=max(total_steps, 1))
    else:
        lr = optax.constant_schedule(config.learning_rate)
    parts = []
    if config.grad_clip_norm:
        parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
    if config.weight_decay and config.weight_decay_mode == "l2":
        parts.append(optax.add_decayed_weights(config.weight_decay))
    parts.append(optax.scale_by_adam())
    if config.weight_decay and config.weight_decay_mode == "decoupled":
        parts.append(optax.add_decayed_weights(config.weight_decay))
    parts.append(optax.scale_by_learning_rate(lr))
    return optax.chain(*parts)
