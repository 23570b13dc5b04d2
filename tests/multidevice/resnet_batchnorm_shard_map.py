"""ResNet18's BatchNorm with axis_name="data" inside shard_map (2 fake CPU devices) normalises
with the global batch statistics: logits and updated statistics equal one device on the whole
batch; without axis_name (the control) each device normalises its own half.
Run by tests/test_networks_resnet.py (tests/multidevice/__init__.py: run_script).
"""

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gedl_jax.networks.resnet import ResNet18


def main() -> None:
    assert jax.device_count() == 2, jax.devices()
    jax.config.update("jax_disable_most_optimizations", True)   # compile in seconds
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x = jax.random.uniform(jax.random.key(0), (8, 8, 8, 3))
    single, synced = ResNet18(10), ResNet18(10, axis_name="data")
    variables = jax.jit(lambda k: single.init(k, x[:1], train=False))(jax.random.key(1))

    def forward(module):
        return lambda v, x: module.apply(v, x, train=True, mutable=["batch_stats"])

    want, want_stats = jax.jit(forward(single))(variables, x)
    out_specs = (P("data"), P())
    got, got_stats = jax.jit(jax.shard_map(forward(synced), mesh=mesh,
                                           in_specs=(P(), P("data")), out_specs=out_specs))(
        variables, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for a, b in zip(jax.tree.leaves(got_stats), jax.tree.leaves(want_stats)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    local, _ = jax.jit(jax.shard_map(forward(single), mesh=mesh, in_specs=(P(), P("data")),
                                     out_specs=out_specs, check_vma=False))(variables, x)
    assert not np.allclose(local, want, atol=1e-3), "control: per-device statistics differ"
    print("OK ResNet18 BatchNorm statistics are global under shard_map")


if __name__ == "__main__":
    main()
