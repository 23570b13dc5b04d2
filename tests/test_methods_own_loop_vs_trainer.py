"""A user's own loop with EvidentialObjective reproduces the built-in trainer's GEDL run.

Same network (the built-in ConvNet, the config's init), same parameter-init key, same data order
(`experiment.run_keys(seed)["order"]` folded with the epoch), same optimiser (the config's Adam
with cosine decay): 20 steps of the trainer's own program (`programs.single`, what
`train.train_and_evaluate` runs) against a plain jitted step calling the objective. The two are
separately compiled XLA programs (the trainer's is a shard_map with in-graph batching), so they
agree to float32 rounding, not necessarily bit for bit.

- **Step by step, on any platform**: the user's step, started from the trainer's state before
  each step, gives the trainer's loss, objective state and next parameters. The parameters'
  tolerance is measured in the test: the same step with im2col convolutions (the same
  convolution summed in another order, as another platform's kernels may) moves a few of them
  by up to ~5e-5 to ~5e-4 on a CPU (`python -m studies.rounding_growth`): Adam divides each
  gradient by its running scale, so a component whose gradient is near zero moves by a
  sizeable part of the learning rate whichever way rounding tips it.
- **Run on its own for 20 steps, on a CPU**: the user's loop follows the trainer's run. Only
  there do the two programs run the same convolution kernels: on a CPU with XLA's
  optimisations off both trajectories are identical, and a change of summation order grows
  about tenfold per step through Adam's first steps (`python -m studies.rounding_growth`, with
  im2col: 1e-5 relative in the loss at step 3, 1-2 % from step 12 on), which a GPU's
  per-program kernel choices would bring.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compile_mode import fast_compilation

from gedl_jax import configs, data
from gedl_jax.run import experiment
from gedl_jax.run import optimizer
from gedl_jax.run import programs
from gedl_jax.run import sharding
from gedl_jax.run import steps
from gedl_jax import EvidentialObjective
from gedl_jax.methods.own_loop import ObjectiveState
from studies.rounding_growth import generated_mnist, own_train_step
from studies.rounding_growth import max_abs_difference

SEED, N, BATCH, STEPS = 0, 256, 32, 20


def init_tolerance(want: np.ndarray, backend: str) -> tuple[float, float]:
    """(rtol, atol) between two compilations of the same truncated-normal initialisation.

    On XLA:CPU they agree to 1e-7. Elsewhere the two programs may fuse the truncated normal's
    arithmetic differently (FMAs), which bounds two errors:
    - erfinv, a 9-term float32 polynomial, each term rounding apart by up to about 2 units:
      32 units (2**-23) of relative error bound it (an H100 measured 12);
    - the uniform draw mapped onto [erf(-sqrt 2), erf(sqrt 2)] = +-0.954 (u * span + lower),
      whose rounding is absolute: at most one unit of 1, 2**-23, apart. Through sqrt(2) erfinv
      (slope sqrt(pi / 2) = 1.2533 at 0) and the initialiser's scale (the draw's 2 sigma is the
      leaf's largest value), that is 2**-23 * 1.2533 * max|leaf| / 2 at most, relatively large
      for values near 0 (an H200 measured 4.2e-5 relative, 2.2e-9 absolute, at values of 3e-4
      in the 5x5x64x64 kernel, whose largest value is about 0.057: half that bound).
      Twice the bound is the margin (`test_init_tolerance_bounds_a_fused_multiply_add`).
    """
    if backend == "cpu":
        return 1e-7, 0.0
    return 32 * 2.0**-23, 2.0**-23 * 1.2533 * float(np.max(np.abs(want)))


def test_init_tolerance_bounds_a_fused_multiply_add():
    """The map of the uniform draw onto the truncated range, rounded twice (multiply, then add)
    and once (a fused multiply-add, emulated in float64), through sqrt(2) erfinv (SciPy, float64)
    at the ConvNet kernel's scale: the two initialisations stay within `init_tolerance`, and
    the absolute term is needed (the relative one alone fails near 0)."""
    from scipy.special import erf, erfinv

    rng = np.random.default_rng(0)
    u = rng.random(1_000_000).astype(np.float32)
    lower, upper = np.float32(erf(-np.sqrt(2))), np.float32(erf(np.sqrt(2)))
    span = upper - lower
    unfused = (u * span).astype(np.float32) + lower
    fused = (u.astype(np.float64) * span + lower).astype(np.float32)
    scale = np.sqrt(1 / 1600) / 0.87962566   # lecun_normal's truncated normal, fan-in 1600

    def leaf(v):
        return scale * np.sqrt(2) * erfinv(v.astype(np.float64))

    got, want = leaf(unfused), leaf(fused)
    rtol, atol = init_tolerance(want, "gpu")
    assert np.all(np.abs(got - want) <= atol + rtol * np.abs(want))
    assert np.any(np.abs(got - want) > rtol * np.abs(want))


@pytest.fixture(scope="module")
def trainer_run():
    """The trainer's 20 steps: its state before each step and after the last, and its losses."""
    with fast_compilation():
        config = configs.build_config("mnist", "gedl")
        config.batch_size = BATCH
        config.num_epochs = 3
        train = generated_mnist()
        steps_per_epoch = N // BATCH                          # as train._prepare_loop
        tx = optimizer.make_optimizer(config, steps_per_epoch * config.num_epochs)
        method = experiment.build_method(config, train)
        settings = steps.StepSettings(steps_per_epoch=steps_per_epoch, batch_size=BATCH,
                                      augment=False, normalize_mean=None, normalize_std=None)
        program = programs.single(method, tx, sharding.make_mesh(jax.devices()[:1]), settings,
                                  SEED, train)
        states, losses = [], []
        for step in range(STEPS):
            if step % steps_per_epoch == 0:
                order = program.epoch_order(step // steps_per_epoch)
            states.append(jax.device_get(program.state))
            program.state, metrics = program.steps(program.state, order, 1)
            losses.append(float(metrics["loss"]))
        states.append(jax.device_get(program.state))
        return TrainerRun(train, method, tx, steps_per_epoch, states, losses)


class TrainerRun(NamedTuple):
    train: data.Split
    method: object
    tx: optax.GradientTransformation
    steps_per_epoch: int
    states: list          # TrainState before step 0, 1, ..., after the last
    losses: list[float]


def _user_setup(run: TrainerRun, model):
    """What a user writes: the init from the run's key, the objective, the data order."""
    keys = experiment.run_keys(SEED)
    params = model.init({"params": keys["init"], "dropout": keys["init"]},
                        jnp.zeros((1, 28, 28, 1)), train=False)["params"]
    objective = EvidentialObjective.gedl(num_classes=10, steps_per_epoch=run.steps_per_epoch)
    assert objective.spec == run.method.spec
    images, labels = jnp.asarray(run.train.images), jnp.asarray(run.train.labels)

    def batch(step):
        epoch, index = divmod(step, run.steps_per_epoch)
        perm = data.epoch_permutation(jax.random.fold_in(keys["order"], epoch), N)
        rows = perm[index * BATCH:(index + 1) * BATCH]
        return data.to_float(images[rows]), labels[rows]

    return params, objective, batch


def _objective_state(objective, state) -> ObjectiveState:
    """The trainer's state as the objective's (the step and GEDL's tau accumulator)."""
    tau = type(objective.init().tau)(*state.method_state)
    return ObjectiveState(jnp.asarray(state.step, jnp.int32), tau)


def test_own_step_equals_the_trainers_step_at_every_step(trainer_run, fast_compile):
    run = trainer_run
    model = run.method.train_model                      # the config's ConvNet (init "flax")
    params, objective, batch = _user_setup(run, model)
    # The user's init is the trainer's (the same key, the same initialisers; another key or
    # initialiser is off by O(1)). The user's runs op by op, the trainer's inside its jitted
    # state init (`init_tolerance`).
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(run.states[0].params)):
        rtol, atol = init_tolerance(np.asarray(want), jax.default_backend())
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    # So is the objective's initial state (step 0, GEDL's empty tau accumulator).
    for got, want in zip(jax.tree.leaves(objective.init()),
                         jax.tree.leaves(_objective_state(objective, run.states[0]))):
        np.testing.assert_array_equal(got, want)
    steps_by_conv = {"auto": own_train_step(model, objective, run.tx),
                     "im2col": own_train_step(model.clone(conv_impl="im2col"), objective, run.tx)}
    params_gap = {name: 0.0 for name in steps_by_conv}
    loss_gap = {name: 0.0 for name in steps_by_conv}
    for step in range(STEPS):
        before, after = run.states[step], run.states[step + 1]
        x, y = batch(step)
        for name, own_step in steps_by_conv.items():
            new_params, _, new_obj_state, loss = own_step(
                before.params, before.opt_state, _objective_state(objective, before), x, y)
            # The GEDL loss, to float32 rounding with either convolution (measured: at most
            # 1.1e-7 relative on a CPU; the KL weight 1/tau makes it rise over the steps).
            loss_gap[name] = max(loss_gap[name],
                                 abs(float(loss) - run.losses[step]) / abs(run.losses[step]))
            # The same tau accumulator and step count after the step.
            assert int(new_obj_state.step) == int(after.step) == step + 1
            for got, want in zip(new_obj_state.tau, after.method_state):
                np.testing.assert_allclose(got, want, rtol=1e-6)
            params_gap[name] = max(params_gap[name],
                                   max_abs_difference(new_params, after.params))
    assert len(set(np.round(run.losses, 4))) > 15          # not a constant trajectory
    final_tau = run.states[-1].method_state
    assert int(final_tau.epoch) == 2 and int(final_tau.epoch_count) == 4   # 2 epochs + 4 steps
    # The loss and the parameters after each step: as close as a change of summation order
    # brings them (on a GPU another convolution algorithm may round more than a CPU's).
    assert loss_gap["im2col"] < 1e-4, loss_gap        # rounding, not another computation
    assert loss_gap["auto"] <= max(2 * loss_gap["im2col"], 1e-6), loss_gap
    assert params_gap["im2col"] < 1e-3, params_gap    # rounding, not another computation
    assert params_gap["auto"] <= max(2 * params_gap["im2col"], 1e-6), params_gap


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="two programs run the same convolution kernels only on XLA:CPU; "
                           "elsewhere a rounding difference grows ~10x per step through Adam's "
                           "first steps (module docstring)")
def test_own_loop_run_on_its_own_follows_the_trainers_run(trainer_run, fast_compile):
    run = trainer_run
    model = run.method.train_model
    params, objective, batch = _user_setup(run, model)
    train_step = own_train_step(model, objective, run.tx)
    opt_state, obj_state = run.tx.init(params), objective.init()
    own_losses = []
    for step in range(STEPS):
        params, opt_state, obj_state, loss = train_step(params, opt_state, obj_state,
                                                        *batch(step))
        own_losses.append(float(loss))
    # The GEDL loss of every step, to float32 rounding (measured: at most ~1.1e-7 relative; the
    # parameters at the end identical with XLA's optimisations off, within ~1.4e-6 with them on).
    np.testing.assert_allclose(own_losses, run.losses, rtol=1e-6)
    assert int(obj_state.step) == int(run.states[-1].step) == STEPS
    for got, want in zip(obj_state.tau, run.states[-1].method_state):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(run.states[-1].params)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
