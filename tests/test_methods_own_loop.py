"""gedl_jax.EvidentialObjective (methods/own_loop.py): the EDL family's loss for a user's own loop.

It must be the trainer's loss (the variants' settings, `losses.per_example_loss` reduced by the
batch mean, the epoch from the step counter), carry GEDL's tau state, and be pure under jit,
vmap and shard_map. The trajectory against the built-in trainer is in
test_methods_own_loop_vs_trainer.py; the documented example in test_library_docs.py.
"""

import dataclasses
import doctest
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from multidevice import run_script

from gedl_jax import configs, evidential as ev
from gedl_jax.evidential import loss as losses
from gedl_jax.run import sharding
from gedl_jax.methods import own_loop
from gedl_jax.methods.evidential import spec_from_config
from gedl_jax.methods.own_loop import EvidentialObjective, ObjectiveState
from compile_mode import fast_compilation

K = 5
VARIANTS = ["gedl", "edl", "iedl", "redl", "red"]


@pytest.fixture(scope="module", autouse=True)
def _fast_compile_module():
    """XLA's optimisations mostly off for this module (as the `fast_compile` fixture per test):
    the steps below are jitted, so each test compiles a few small programs."""
    with fast_compilation():
        yield


def _batch(b=8, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(0, scale, (b, K)), jnp.float32),
            jnp.asarray(rng.integers(0, K, b), jnp.int32))


def _config(variant, dataset="mnist", **fields):
    config = configs.build_config(dataset, variant)
    config.num_classes = K
    for key, value in fields.items():
        config[key] = value
    return config


@pytest.mark.parametrize("variant", VARIANTS)
def test_named_constructors_give_the_cli_presets(variant):
    obj = getattr(EvidentialObjective, variant)(K, steps_per_epoch=7)
    assert obj.spec == spec_from_config(_config(variant))
    assert (obj.steps_per_epoch, obj.axis_name, obj.num_classes) == (7, None, K)
    assert obj == EvidentialObjective.variant(variant, K, 7)
    assert obj == EvidentialObjective.from_config(_config(variant), 7)


def test_dataset_dependent_settings_overrides_and_base_rate():
    assert EvidentialObjective.iedl(K, 3).spec.fisher_logdet_weight == 0.005
    assert EvidentialObjective.iedl(K, 3, protocol="cifar10").spec.fisher_logdet_weight == 0.05
    assert EvidentialObjective.red(K, 3).spec.exp_clip == 80.0
    assert EvidentialObjective.red(K, 3, protocol="cifar100").spec.exp_clip == 10.0
    assert EvidentialObjective.gedl(K, 3, protocol="cifar100").spec.warmup_epochs == 5
    assert EvidentialObjective.redl(K, 3).spec.prior_strength_value == pytest.approx(0.1 * K)
    changed = EvidentialObjective.gedl(K, 3, c_tau=50, tau_reading="step", c_w=0.7)
    assert (changed.spec.c_tau, changed.spec.tau_reading, changed.spec.c_w) == (50.0, "step", 0.7)
    assert EvidentialObjective.edl(K, 3, prior_strength_value=2).spec.prior_strength_value == 2.0
    assert EvidentialObjective.edl(K, 3, prior_strength_value="0.5K").spec \
        .prior_strength_value == 2.5
    ablation = EvidentialObjective.variant("ablation_kl_all_tau", K, 3)
    assert ablation.spec == spec_from_config(_config("ablation_kl_all_tau"))
    rate = (0.1, 0.2, 0.3, 0.2, 0.2)
    assert EvidentialObjective.gedl(K, 3, base_rate=rate).spec.base_rate == rate


@pytest.mark.parametrize("call,error,message", [
    (lambda: EvidentialObjective.variant("softmax", K, 3), ValueError,
     r"'softmax' is not an EDL-family variant; choose one of \['gedl', 'edl'"),
    (lambda: EvidentialObjective.gedl(K, 3, protocol="imagenet"), ValueError,
     r"protocol='imagenet' is not known; choose one of \['mnist', 'fashion_mnist'"),
    (lambda: EvidentialObjective.gedl(K, 3, c_tua=1.0), TypeError,
     r"unknown setting\(s\) \['c_tua'\]; the settings are \['evidence'"),
    (lambda: EvidentialObjective.gedl(K, 3, c_tau=-1.0), ValueError,
     r"config.c_tau=-1.0 must be > 0"),
    (lambda: EvidentialObjective.gedl(K, 3, tau_reading="month"), ValueError,
     r"config.tau_reading='month' is not allowed; allowed values: \['epoch', 'step'"),
    (lambda: EvidentialObjective.gedl(K, 3, warmup_epochs=1.5), TypeError,
     r"setting warmup_epochs=1.5: .*cannot be casted"),
    (lambda: EvidentialObjective.gedl(1, 3), ValueError, r"config.num_classes=1 must be >= 2"),
    (lambda: EvidentialObjective.gedl(K, 0), ValueError,
     r"steps_per_epoch must be a positive integer, got 0"),
    (lambda: EvidentialObjective.gedl(K, 2.5), ValueError,
     r"steps_per_epoch must be a positive integer, got 2.5"),
    (lambda: EvidentialObjective.gedl(K, 3, base_rate=(0.5, 0.5)), ValueError,
     r"base_rate must be 5 positive values summing to 1"),
    (lambda: EvidentialObjective("gedl", 3), TypeError,
     r"spec must be a gedl_jax.evidential.loss.LossSpec"),
])
def test_bad_settings_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("variant", VARIANTS + ["ablation_base"])
def test_loss_is_the_batch_mean_of_losses_per_example_loss(variant):
    obj = EvidentialObjective.variant(variant, K, steps_per_epoch=2)
    objective = jax.jit(obj)
    reference = jax.jit(lambda logits, labels, tau, epoch: losses.per_example_loss(
        obj.spec, logits, labels, tau, epoch))
    state = obj.init()
    tau = ev.tau_init()
    for step in range(5):   # across two epoch boundaries
        logits, labels = _batch(seed=step)
        loss, state, metrics = objective(logits, labels, state)
        loss_B, tau, terms = reference(logits, labels, tau, jnp.int32(step // 2))
        np.testing.assert_allclose(loss, jnp.mean(loss_B), rtol=1e-6)
        np.testing.assert_array_equal(metrics["loss"], loss)
        np.testing.assert_allclose(metrics["likelihood"], jnp.mean(terms.likelihood_B),
                                   rtol=1e-6)
        np.testing.assert_allclose(metrics["kl"], jnp.mean(terms.kl_B), rtol=1e-6, atol=1e-7)
        for name in ("kl_weight", "mean_strength", "mean_prior_strength"):
            np.testing.assert_allclose(metrics[name], getattr(terms, name), rtol=1e-6)
        np.testing.assert_allclose(metrics["accuracy"],
                                   jnp.mean(jnp.argmax(logits, -1) == labels))
        assert int(metrics["epoch"]) == step // 2 and int(state.step) == step + 1
        for got, want in zip(state.tau, tau):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_state_follows_the_epochs_of_the_step_counter():
    """epoch = step // steps_per_epoch, as the trainer derives it: EDL's KL weight is
    min(1, epoch/10) and GEDL's epoch reading moves a finished epoch's mean into the sum."""
    edl = EvidentialObjective.edl(K, steps_per_epoch=3, annealing_epochs=2.0)
    state, weights = edl.init(), []
    for _ in range(9):
        _, state, metrics = jax.jit(edl)(*_batch(), state)
        weights.append(float(metrics["kl_weight"]))
    assert weights == [0.0] * 3 + [0.5] * 3 + [1.0] * 3
    gedl = EvidentialObjective.gedl(K, steps_per_epoch=2)
    state, strengths = gedl.init(), []
    for step in range(5):
        _, state, metrics = jax.jit(gedl)(*_batch(seed=step), state)
        strengths.append(float(metrics["mean_strength"]))
    assert int(state.tau.epoch) == 2 and int(state.tau.epoch_count) == 1
    np.testing.assert_allclose(float(state.tau.completed_sum),
                               np.mean(strengths[0:2]) + np.mean(strengths[2:4]), rtol=1e-6)
    # The KL weight is 1/tau = min(1, sum / C_tau) with the current epoch's running mean.
    np.testing.assert_allclose(float(metrics["kl_weight"]),
                               (float(state.tau.completed_sum) + strengths[4]) / 100.0, rtol=1e-6)


def test_jit_grad_and_static_pytree():
    obj = EvidentialObjective.gedl(K, steps_per_epoch=4)
    assert jax.tree.leaves(obj) == [] and hash(obj) == hash(EvidentialObjective.gedl(K, 4))
    logits, labels = _batch()

    @jax.jit
    def step(obj, logits, state):   # the objective passed as a (leafless) jit argument
        (loss, (state, metrics)), grad = jax.value_and_grad(
            lambda z: (lambda out: (out[0], out[1:]))(obj(z, labels, state)), has_aux=True)(
            logits)
        return loss, state, grad

    state = obj.init()
    loss, new_state, grad = step(obj, logits, state)
    eager_loss, eager_state, _ = jax.jit(obj)(logits, labels, state)
    np.testing.assert_allclose(loss, eager_loss, rtol=1e-6)
    assert isinstance(new_state, ObjectiveState) and int(new_state.step) == 1
    assert grad.shape == logits.shape and bool(jnp.all(jnp.isfinite(grad)))
    np.testing.assert_allclose(new_state.tau.step_sum, eager_state.tau.step_sum, rtol=1e-6)


def test_vmap_over_seeds_with_a_leading_state_axis():
    obj = EvidentialObjective.gedl(K, steps_per_epoch=2)
    logits_SxBxK = jnp.stack([_batch(seed=s)[0] for s in range(3)])
    labels_SxB = jnp.stack([_batch(seed=s)[1] for s in range(3)])
    states = jax.tree.map(lambda x: jnp.stack([x] * 3), obj.init())
    batched, single = jax.jit(jax.vmap(obj)), jax.jit(obj)
    for _ in range(3):
        loss_S, states, _ = batched(logits_SxBxK, labels_SxB, states)
    for s in range(3):
        state = obj.init()
        for _ in range(3):
            loss, state, _ = single(logits_SxBxK[s], labels_SxB[s], state)
        np.testing.assert_allclose(loss_S[s], loss, rtol=1e-6)
        np.testing.assert_allclose(states.tau.completed_sum[s], state.tau.completed_sum,
                                   rtol=1e-6)


@pytest.mark.parametrize("variant", ["gedl", "red"])
def test_axis_name_averages_over_the_devices_batches(variant):
    """Four shards of a batch under a named axis (as inside shard_map) give the loss, state and
    metrics of the whole batch on one device: tau's E[S] is the global batch mean."""
    whole = EvidentialObjective.variant(variant, K, steps_per_epoch=2)
    sharded = dataclasses.replace(whole, axis_name="data")
    logits, labels = _batch(b=16)
    state_whole = state_sharded = whole.init()
    on_shards = jax.jit(jax.vmap(sharded, in_axes=(0, 0, None), axis_name="data"))
    for _ in range(3):
        loss, state_whole, metrics = jax.jit(whole)(logits, labels, state_whole)
        loss_4, states_4, metrics_4 = on_shards(logits.reshape(4, 4, K), labels.reshape(4, 4),
                                                state_sharded)
        state_sharded = jax.tree.map(lambda x: x[0], states_4)   # identical on every shard
        for shard in range(4):
            np.testing.assert_allclose(loss_4[shard], loss, rtol=1e-6)
            for name, value in metrics.items():
                np.testing.assert_allclose(metrics_4[name][shard], value, rtol=1e-6)
            for got, want in zip(jax.tree.leaves(states_4), jax.tree.leaves(state_whole)):
                np.testing.assert_allclose(got[shard], want, rtol=1e-6)


def test_inside_shard_map_on_one_device():
    mesh = sharding.make_mesh(jax.devices()[:1])
    obj = EvidentialObjective.gedl(K, steps_per_epoch=2, axis_name=sharding.AXIS)
    logits, labels = _batch()
    fn = jax.jit(jax.shard_map(obj, mesh=mesh, in_specs=(P(sharding.AXIS), P(sharding.AXIS), P()),
                               out_specs=(P(), P(), P())))
    loss, state, metrics = fn(logits, labels, obj.init())
    want, _, _ = EvidentialObjective.gedl(K, steps_per_epoch=2)(logits, labels, obj.init())
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    assert int(state.step) == 1 and set(metrics) >= {"loss", "kl_weight", "epoch"}


def test_data_parallel_on_two_devices():
    """shard_map over 2 fake CPU devices: loss, gradients and state equal one device's on the
    global batch (tests/multidevice/own_loop_shard_map.py)."""
    run_script("own_loop_shard_map.py", devices=2)


def test_shape_errors_at_trace_time():
    obj = EvidentialObjective.gedl(K, 2)
    logits, labels = _batch()
    with pytest.raises(ValueError, match=r"logits_BxK must have shape \(B, 5\), got \(8, 4\)"):
        obj(logits[:, :4], labels, obj.init())
    with pytest.raises(ValueError, match=r"labels_B must be 8 integer labels, got \(8,\) float32"):
        obj(logits, labels.astype(jnp.float32), obj.init())


def test_dirichlet_predictions():
    obj = EvidentialObjective.gedl(K, 2)
    logits, _ = _batch()
    out = obj.dirichlet(logits)
    want = losses.evidential_outputs(obj.spec, logits)
    for got, expected in zip(out, want):
        np.testing.assert_array_equal(got, expected)


def test_docstring_example_and_lazy_export():
    result = doctest.testmod(own_loop, extraglobs={"jnp": jnp, "np": np, "ev": ev},
                             verbose=False, report=True)
    assert result.attempted > 0 and result.failed == 0
    import gedl_jax

    assert gedl_jax.EvidentialObjective is EvidentialObjective
    assert gedl_jax.ObjectiveState is ObjectiveState
    # `import gedl_jax` alone does not import the methods layer; the name does, on first use.
    code = ("import sys, gedl_jax; "
            "assert 'gedl_jax.methods.own_loop' not in sys.modules; gedl_jax.EvidentialObjective; "
            "assert 'gedl_jax.methods.own_loop' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("bad", [-1, K])
def test_a_label_outside_the_classes_raises_eager_and_jitted(bad):
    """A label outside [0, K) gave a NaN loss and nothing else; now a ValueError naming the
    range (eager), and the jitted step fails when it runs with that message; turned off, the
    loss is NaN as the per-example functions document."""
    obj = EvidentialObjective.gedl(num_classes=K, steps_per_epoch=2)
    logits, labels = jnp.zeros((3, K)), jnp.array([0, bad, 1])
    message = rf"labels_B must be class indices in \[0, {K}\), got labels from {min(0, bad)}"
    with pytest.raises(ValueError, match=message):
        obj(logits, labels, obj.init())
    with pytest.raises(Exception, match=message):   # JaxRuntimeError around the ValueError
        jax.block_until_ready(jax.jit(obj)(logits, labels, obj.init()))
    good = jax.jit(obj)(logits, jnp.array([0, K - 1, 1]), obj.init())[0]
    assert np.isfinite(float(good))
    unchecked = dataclasses.replace(obj, check_labels=False)
    assert np.isnan(float(jax.jit(unchecked)(logits, labels, obj.init())[0]))


def test_a_bad_label_under_jit_is_reported_as_the_eager_one_line_with_exit_2(capsys, caplog):
    """Under `jax.jit` the check's ValueError reaches the caller as jax's "INTERNAL: CpuCallback
    error" with the message at the end of a traceback, after jax logged that traceback: a
    command (`cli.guarded`) reports it as the eager call's one line, exit 2, and drops the
    log record."""
    from gedl_jax.commands import cli

    obj = EvidentialObjective.gedl(num_classes=K, steps_per_epoch=2)
    logits, labels = jnp.zeros((3, K)), jnp.array([0, K, 1])
    assert cli.guarded(lambda: obj(logits, labels, obj.init()) and 0, debug=False) == 2
    eager = capsys.readouterr().err
    assert eager.startswith("error: labels_B must be class indices") and eager.count("\n") == 1
    with caplog.at_level("ERROR"):
        jitted = cli.guarded(lambda: jax.block_until_ready(
            jax.jit(obj)(logits, labels, obj.init())) and 0, debug=False)
    assert jitted == 2 and capsys.readouterr().err == eager
    assert "jax.debug.callback failed" not in caplog.text
    assert cli.callback_error(RuntimeError("INTERNAL: something else")) is None
