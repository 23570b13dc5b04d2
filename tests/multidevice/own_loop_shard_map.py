"""EvidentialObjective with axis_name="data" inside shard_map (2 fake CPU devices): the loss,
the parameter gradients (of the replicated, pmean'd loss, the trainer's convention) and the
objective's state equal one device's on the whole batch, step after step (SGD updates between).
Run by tests/test_methods_own_loop.py (tests/multidevice/__init__.py: run_script).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gedl_jax import EvidentialObjective
from gedl_jax.networks.mlp import MLP

K = 4


def main() -> None:
    assert jax.device_count() == 2, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(16, 12)), jnp.float32)
    y = jnp.asarray(rng.integers(0, K, 16), jnp.int32)
    model = MLP(num_classes=K, hidden=(32,))
    params = model.init(jax.random.key(0), x[:1])["params"]
    tx = optax.sgd(0.5)

    def make_step(obj):
        def step(params, x, y, state):
            def loss_fn(p):
                loss, new_state, metrics = obj(model.apply({"params": p}, x), y, state)
                return loss, (new_state, metrics)

            (loss, (state, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, _ = tx.update(grads, tx.init(params), params)
            return optax.apply_updates(params, updates), state, loss, grads, metrics
        return step

    single = jax.jit(make_step(EvidentialObjective.gedl(K, steps_per_epoch=2)))
    sharded = jax.jit(jax.shard_map(
        make_step(EvidentialObjective.gedl(K, steps_per_epoch=2, axis_name="data")), mesh=mesh,
        in_specs=(P(), P("data"), P("data"), P()), out_specs=(P(), P(), P(), P(), P())))
    p1 = p2 = params
    s1 = s2 = EvidentialObjective.gedl(K, 2).init()
    for _ in range(5):   # two epoch boundaries of the tau accumulator
        p1, s1, loss1, g1, m1 = single(p1, x, y, s1)
        p2, s2, loss2, g2, m2 = sharded(p2, x, y, s2)
        np.testing.assert_allclose(loss2, loss1, rtol=2e-6)
        for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-7)
        for a, b in zip(jax.tree.leaves(s2), jax.tree.leaves(s1)):
            np.testing.assert_allclose(a, b, rtol=2e-6)
        for name in m1:
            np.testing.assert_allclose(m2[name], m1[name], rtol=2e-6)
    assert int(s2.step) == 5 and int(s2.tau.epoch) == 2
    print("OK objective under shard_map equals one device on the global batch")


if __name__ == "__main__":
    main()
