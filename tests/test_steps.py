"""gedl_jax.run.steps on 4 fake CPU devices: the data-parallel step equals the
single-device step on the same batch, and the multi-seed (vmapped) step equals each seed alone.
The scripts are tests/multidevice/*.py (a fresh process each: the device count must be set
before JAX initialises).
"""

import pytest
from multidevice import run_script


def test_data_parallel_step_equals_single_device():
    run_script("data_parallel_step.py", devices=4)


@pytest.mark.parametrize("model", [
    "small", pytest.param("vgg16", marks=[pytest.mark.slow, pytest.mark.extended])])
def test_multi_seed_step_equals_each_seed_alone(model):
    """vmap over seeds inside shard_map (4 devices): each seed's batch, normalisation,
    augmentation, dropout, synchronised batch-norm statistics and update equal its own step.
    A small network with all of these by default; the CIFAR VGG16-bn (2.5 CPU-minutes in
    float64) with --run-extended."""
    assert f"OK {model}" in run_script("multi_seed_step.py", devices=4, args=(model,))
