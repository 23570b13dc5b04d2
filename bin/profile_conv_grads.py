#!/usr/bin/env python
"""Per-layer timing of a model's convolutions on this machine: forward, input gradient, weight
gradient, and alternative formulations of the weight gradient.

Why: on XLA:CPU the weight-gradient convolutions are the slowest part of the train step
(docs/performance.md). This prints, for every distinct conv shape of the MNIST ConvNet or the
CIFAR VGG16 at a given batch, the best-of-3 time (ms) of

    fwd      lax.conv_general_dilated (what the models run)
    dx       its input gradient (jax.vjp)
    dw       its weight gradient (jax.vjp), what the train step runs
    im2col   dw as one matmul of the im2col patches with the output gradient
    shifted  dw as kh*kw matmuls of shifted input windows with the output gradient
    tconv    dw as a forward conv with the batch as the contracted feature axis

and each alternative's max relative error against `dw`. XLA flags can be compared by running it
under different `XLA_FLAGS` (e.g. `--xla_cpu_use_onednn=true`).

    python bin/profile_conv_grads.py --model=vgg16 --batch=128
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

SHAPES = {  # (input H=W, C_in, C_out, kernel) of every distinct conv layer
    "convnet": [(28, 1, 64, 5), (14, 64, 64, 5), (7, 64, 64, 5)],
    "vgg16": [(32, 3, 64, 3), (32, 64, 64, 3), (16, 64, 128, 3), (16, 128, 128, 3),
              (8, 128, 256, 3), (8, 256, 256, 3), (4, 256, 512, 3), (4, 512, 512, 3),
              (2, 512, 512, 3)],
}


def conv(x, w, pad):
    return jax.lax.conv_general_dilated(x, w, (1, 1), (pad, pad),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def best_ms(fn, *args, repeats: int = 3, inner: int = 5) -> float:
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / inner)
    return 1e3 * min(times)


def xla_ops(pad):
    """(forward, input gradient, weight gradient) of the XLA convolution."""
    def forward(x, w):
        return conv(x, w, pad)

    def input_grad(x, w, g):
        return jax.vjp(lambda x_: conv(x_, w, pad), x)[1](g)[0]

    def weight_grad(x, w, g):
        return jax.vjp(lambda w_: conv(x, w_, pad), w)[1](g)[0]

    return forward, input_grad, weight_grad


def weight_grad_variants(h: int, c_in: int, c_out: int, k: int):
    pad = ((k - 1) // 2, k // 2)

    def padded(x):
        return jnp.pad(x, ((0, 0), pad, pad, (0, 0)))

    def im2col(x, g):
        xp = padded(x)
        patches = jnp.concatenate([xp[:, dy:dy + h, dx:dx + h, :] for dy in range(k)
                                   for dx in range(k)], -1)
        return (patches.reshape(-1, k * k * c_in).T @ g.reshape(-1, c_out)).reshape(
            k, k, c_in, c_out)

    def shifted(x, g):
        xp, g2 = padded(x), g.reshape(-1, c_out)
        rows = [jax.lax.dot_general(xp[:, dy:dy + h, dx:dx + h, :].reshape(-1, c_in), g2,
                                    (((0,), (0,)), ((), ()))) for dy in range(k) for dx in range(k)]
        return jnp.stack(rows).reshape(k, k, c_in, c_out)

    def tconv(x, g):
        lhs = jnp.transpose(padded(x), (3, 1, 2, 0))   # (C_in, Hp, Wp, B)
        rhs = jnp.transpose(g, (1, 2, 0, 3))            # (H, W, B, C_out)
        out = jax.lax.conv_general_dilated(lhs, rhs, (1, 1), "VALID",
                                           dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.transpose(out, (1, 2, 0, 3))

    return pad, {"im2col": im2col, "shifted": shifted, "tconv": tconv}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vgg16", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args(argv)
    print(f"# {args.model} batch {args.batch}; jax {jax.__version__} on "
          f"{jax.devices()[0].device_kind}; best of 3, ms", flush=True)
    rng = np.random.default_rng(0)
    totals: dict[str, float] = {}
    for h, c_in, c_out, k in SHAPES[args.model]:
        x = jnp.asarray(rng.random((args.batch, h, h, c_in), np.float32))
        w = jnp.asarray(0.1 * rng.random((k, k, c_in, c_out), np.float32))
        g = jnp.asarray(rng.random((args.batch, h, h, c_out), np.float32))
        pad, variants = weight_grad_variants(h, c_in, c_out, k)
        forward, input_grad, weight_grad = xla_ops(pad)
        row = {"fwd": best_ms(forward, x, w), "dx": best_ms(input_grad, x, w, g),
               "dw": best_ms(weight_grad, x, w, g)}
        reference = jax.jit(weight_grad)(x, w, g)
        errors = {}
        for name, fn in variants.items():
            row[name] = best_ms(fn, x, g)
            errors[name] = float(jnp.max(jnp.abs(jax.jit(fn)(x, g) - reference))
                                 / jnp.max(jnp.abs(reference)))
        for key, value in row.items():
            totals[key] = totals.get(key, 0.0) + value
        print(f"{h:2d}x{h:<2d} {c_in:3d}->{c_out:3d} k{k}: "
              + "  ".join(f"{key} {value:7.1f}" for key, value in row.items())
              + "  | rel err " + " ".join(f"{n} {e:.0e}" for n, e in errors.items()), flush=True)
    print("total: " + "  ".join(f"{key} {value:.1f}" for key, value in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
