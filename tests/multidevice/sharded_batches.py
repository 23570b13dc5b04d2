"""Batches taken, augmented and scaled on device are laid out over the "data" axis of a 4-device
mesh (4 examples per device; placed with gedl_jax.run.sharding, laid out as steps.make_train_step
does), with the same values as on one device. Run by tests/test_data_device.py
(tests/multidevice/__init__.py: run_script).
"""

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import data
from gedl_jax.run import sharding


def main() -> None:
    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    split = data.Split(rng.integers(0, 256, (100, 32, 32, 3), dtype=np.uint8),
                       rng.integers(0, 10, 100).astype(np.int32), "x")
    for mesh in (sharding.make_mesh(),):
        images = sharding.put_replicated(mesh, split.images)
        labels = sharding.put_replicated(mesh, split.labels)
        assert images.sharding.is_fully_replicated
        layout = sharding.batch_sharding(mesh)

        @jax.jit
        def batch(images, labels, perm, step):
            x, y = data.take_batch(images, labels, perm, step, 16)
            x = data.augment_cifar(jax.random.fold_in(jax.random.PRNGKey(0), step), x)
            return (jax.lax.with_sharding_constraint(data.to_float(x), layout),
                    jax.lax.with_sharding_constraint(y, layout))

        perm = data.epoch_permutation(jax.random.PRNGKey(1), 100)
        x, y = batch(images, labels, perm, 2)
        assert x.shape == (16, 32, 32, 3) and len(x.addressable_shards) == 4
        assert {s.data.shape for s in x.addressable_shards} == {(4, 32, 32, 3)}
        assert {s.data.shape for s in y.addressable_shards} == {(4,)}
        # The same values as on one device.
        _, y1 = jax.jit(lambda i, lab, p, s: data.take_batch(i, lab, p, s, 16))(
            jnp.asarray(split.images), jnp.asarray(split.labels), perm, 2)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(y1))
    print("OK")


if __name__ == "__main__":
    main()
