"""Device-side input: permutation, batching, augmentation, scaling, eval padding, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
from multidevice import run_script

from gedl_jax import data
from gedl_jax.run import sharding


def _images(n=32, shape=(32, 32, 3), seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


def test_epoch_permutation_is_a_deterministic_permutation():
    p = data.epoch_permutation(jax.random.PRNGKey(0), 1000)
    assert p.dtype == jnp.int32 and sorted(np.asarray(p)) == list(range(1000))
    np.testing.assert_array_equal(p, data.epoch_permutation(jax.random.PRNGKey(0), 1000))
    assert not np.array_equal(p, data.epoch_permutation(jax.random.PRNGKey(1), 1000))


def test_take_batch_covers_an_epoch_once_and_drops_the_remainder():
    n, b = 103, 10
    images = jnp.asarray(_images(n, (4, 4, 1)))
    labels = jnp.arange(n, dtype=jnp.int32)
    perm = data.epoch_permutation(jax.random.PRNGKey(3), n)
    step = jax.jit(data.take_batch, static_argnums=4)
    seen = []
    for i in range(n // b):
        x, y = step(images, labels, perm, i, b)
        assert x.shape == (b, 4, 4, 1) and x.dtype == jnp.uint8 and y.shape == (b,)
        np.testing.assert_array_equal(x, images[y])
        seen.extend(np.asarray(y).tolist())
    assert len(seen) == len(set(seen)) == 100
    np.testing.assert_array_equal(seen, np.asarray(perm[:100]))


def test_to_float_scaling_and_normalisation():
    x = jnp.asarray(np.array([[[[0, 255, 51]]]], np.uint8))
    np.testing.assert_allclose(data.to_float(x), [[[[0.0, 1.0, 0.2]]]], atol=1e-7)
    mean, std = np.array([0.5, 0.5, 0.2], np.float32), np.array([0.5, 0.25, 0.1], np.float32)
    np.testing.assert_allclose(data.to_float(x, mean, std), [[[[-1.0, 2.0, 0.0]]]], atol=1e-6)
    assert data.to_float(x).dtype == jnp.float32


def test_channel_stats():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (50, 8, 8, 3), dtype=np.uint8)
    split = data.Split(images, np.zeros(50, np.int32), "x")
    mean, std = data.channel_stats(split)
    ref = images.reshape(-1, 3) / 255.0
    np.testing.assert_allclose(mean, ref.mean(0), rtol=1e-6)
    np.testing.assert_allclose(std, ref.std(0), rtol=1e-5)


def test_augment_keeps_shape_dtype_range_and_varies_by_step():
    x = jnp.asarray(_images(64))
    aug = jax.jit(data.augment_cifar)
    key = jax.random.PRNGKey(0)
    for images in (x, data.to_float(x)):
        a0 = aug(jax.random.fold_in(key, 0), images)
        a1 = aug(jax.random.fold_in(key, 1), images)
        assert a0.shape == images.shape and a0.dtype == images.dtype
        assert float(a0.min()) >= 0 and float(a0.max()) <= float(images.max())
        assert not np.array_equal(a0, a1)
        np.testing.assert_array_equal(a0, aug(jax.random.fold_in(key, 0), images))
    # per-example: the same image in every row still gets different transforms
    same = jnp.broadcast_to(x[:1], x.shape)
    out = np.asarray(aug(key, same))
    assert len({out[i].tobytes() for i in range(64)}) > 32


def test_augment_identity_flip_and_crop_are_exact():
    x = _images(4)
    zeros = jnp.zeros(4, jnp.int32)
    ident = data.apply_geometry(jnp.asarray(x), jnp.zeros(4, bool), zeros, zeros, jnp.zeros(4))
    np.testing.assert_array_equal(ident, x)
    flipped = data.apply_geometry(jnp.asarray(x), jnp.ones(4, bool), zeros, zeros, jnp.zeros(4))
    np.testing.assert_array_equal(flipped, x[:, :, ::-1])
    # RandomCrop window at offset (8, 0) of the 4-padded image: shift down-left
    dy, dx = jnp.full(4, 4, jnp.int32), jnp.full(4, -4, jnp.int32)
    crop = np.asarray(data.apply_geometry(jnp.asarray(x), jnp.zeros(4, bool), dy, dx,
                                          jnp.zeros(4)))
    padded = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)))
    np.testing.assert_array_equal(crop, padded[:, 8:40, 0:32])
    rot90 = data.apply_geometry(jnp.asarray(x), jnp.zeros(4, bool), zeros, zeros,
                                jnp.full(4, 90.0))
    np.testing.assert_array_equal(rot90, np.rot90(x, 1, axes=(1, 2)))  # counter-clockwise


def test_augment_matches_the_torchvision_pil_pipeline():
    """flip -> pad 4 + crop 32 -> PIL rotate(angle, NEAREST, fill 0), as torchvision on PIL."""
    from PIL import Image

    rng = np.random.default_rng(1)
    n = 48
    x = _images(n, seed=2)
    flip = rng.random(n) < 0.5
    off = rng.integers(0, 9, (n, 2))
    angle = rng.uniform(-15, 15, n).astype(np.float32)
    ours = np.asarray(data.apply_geometry(jnp.asarray(x), jnp.asarray(flip),
                                          jnp.asarray(off[:, 0] - 4), jnp.asarray(off[:, 1] - 4),
                                          jnp.asarray(angle)))
    ref = []
    for i in range(n):
        im = x[i][:, ::-1] if flip[i] else x[i]
        crop = np.pad(im, ((4, 4), (4, 4), (0, 0)))[off[i, 0]:off[i, 0] + 32,
                                                     off[i, 1]:off[i, 1] + 32]
        ref.append(np.asarray(Image.fromarray(np.ascontiguousarray(crop)).rotate(
            float(angle[i]), resample=Image.NEAREST, fillcolor=0)))
    agree = (ours == np.stack(ref)).mean()
    assert agree > 0.998, agree  # float32 vs PIL's fixed point differ only on exact ties


def test_pad_for_eval_scores_each_example_once():
    n, b = 23, 8
    images = _images(n, (2, 2, 1))
    labels = np.arange(n, dtype=np.int32)
    xs, ys, mask = data.pad_for_eval(images, labels, b)
    assert xs.shape == (3, b, 2, 2, 1) and ys.shape == mask.shape == (3, b)
    assert mask.sum() == n and not mask[-1, -1]
    np.testing.assert_array_equal(ys[mask], labels)
    np.testing.assert_array_equal(xs[mask], images)
    assert (xs[~mask] == 0).all()
    xs, ys, mask = data.pad_for_eval(images[:16], labels[:16], b)
    assert xs.shape[0] == 2 and mask.all()


def test_placement_single_device():
    mesh = sharding.make_mesh()
    images = sharding.put_replicated(mesh, _images(10, (4, 4, 1)))
    assert isinstance(images, jax.Array) and images.dtype == jnp.uint8
    assert images.sharding.is_fully_replicated
    batched = sharding.put_batched(mesh, _images(12, (4, 4, 1)).reshape(3, 4, 4, 4, 1))
    np.testing.assert_array_equal(np.asarray(batched).reshape(12, 4, 4, 1), _images(12, (4, 4, 1)))


def test_batches_laid_out_over_the_data_axis():
    run_script("sharded_batches.py", devices=4, timeout=120)
