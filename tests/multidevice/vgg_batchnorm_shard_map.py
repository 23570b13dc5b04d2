"""VGG16's BatchNorm with axis_name="data" inside shard_map (4 fake CPU devices) normalises with
the global batch statistics: outputs and updated statistics equal one device on the whole
batch; without axis_name (the control) each device normalises its own 2 examples.
Run by tests/test_networks_protocol.py (tests/multidevice/__init__.py: run_script).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gedl_jax.networks import VGG16


def main() -> None:
    assert jax.device_count() == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x = jax.random.uniform(jax.random.key(0), (8, 32, 32, 3))
    single = VGG16(10, dropout_rate=0.0)
    synced = VGG16(10, dropout_rate=0.0, axis_name="data")
    shapes = jax.eval_shape(lambda: single.init(jax.random.key(1), x[:1], train=False))
    rng = np.random.default_rng(0)   # random parameters, faster than compiling init

    def draw(path, s):
        name = path[-1].key
        if name == "kernel":
            std = np.sqrt(2 / np.prod(s.shape[:-1]))
            return jnp.asarray(rng.normal(0, std, s.shape), jnp.float32)
        base = {"scale": 1.0, "var": 1.0}.get(name, 0.0)
        return jnp.asarray(base + 0.1 * rng.normal(size=s.shape) ** 2, jnp.float32)

    variables = jax.tree_util.tree_map_with_path(draw, shapes)

    def train_apply(model):
        return lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"])

    y1, s1 = jax.jit(train_apply(single))(variables, x)
    y4, s4 = jax.jit(jax.shard_map(train_apply(synced), mesh=mesh, in_specs=(P(), P("data")),
                                   out_specs=(P("data"), P())))(variables, x)
    assert y4.shape == y1.shape == (8, 10)
    np.testing.assert_allclose(y4, y1, rtol=1e-4, atol=1e-5)
    flat1, flat4 = jax.tree_util.tree_leaves(s1), jax.tree_util.tree_leaves(s4)
    assert len(flat1) == len(flat4) == 26
    for a, b in zip(flat1, flat4):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    # Control: without axis_name each device normalises with its own 2 examples.
    local = jax.shard_map(train_apply(single), mesh=mesh, in_specs=(P(), P("data")),
                          out_specs=(P("data"), P("data")), check_vma=False)
    y_local, _ = jax.jit(local)(variables, x)
    assert not np.allclose(y_local, y1, rtol=1e-3, atol=1e-4)
    print("OK", float(np.abs(y4 - y1).max()))


if __name__ == "__main__":
    main()
