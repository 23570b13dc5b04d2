"""KL-weight schedules: EDL's annealing and GEDL's accumulated-strength tau (Eq. tau_schedule),
against a plain Python float64 simulation of the definitions (EDL's 0-based epoch counter; the
readings of GEDL's sum: per epoch, per iteration, completed epochs only)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gedl_jax import evidential as ev

# ---------------------------------------------------------------------------- EDL annealing


def test_edl_annealing_endpoints_and_monotonicity():
    assert float(ev.edl_annealing(0)) == 0.0
    assert float(ev.edl_annealing(10)) == 1.0
    assert float(ev.edl_annealing(25)) == 1.0
    assert float(ev.edl_annealing(3)) == pytest.approx(0.3)
    assert float(ev.edl_annealing(2.5, annealing_epochs=5.0)) == pytest.approx(0.5)
    epochs = jnp.arange(0.0, 20.0, 0.25)          # fractional epochs (Sensoy's per-step ramp)
    weights = np.asarray(jax.jit(ev.edl_annealing)(epochs))
    np.testing.assert_allclose(weights, np.minimum(1.0, np.arange(0.0, 20.0, 0.25) / 10.0),
                               rtol=1e-7)
    assert np.all(np.diff(weights) >= 0) and weights.dtype == np.float32
    assert float(ev.edl_annealing(-1)) == 0.0             # clipped to [0, 1]


def test_edl_annealing_traced_int_epoch_does_not_retrace():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def weight(epoch):
        return ev.edl_annealing(epoch, 10.0)

    for epoch in range(12):
        assert float(weight(jnp.int32(epoch))) == pytest.approx(min(1.0, epoch / 10))


# ---------------------------------------------------------------------------------- GEDL tau


def _simulate(strengths, epochs, reading):
    """The definition, in Python float64: cumulative sum_{i<=t} E[S] with one term per step
    ("step") or per epoch, the current epoch's term being its running mean ("epoch")."""
    completed, current, out = [], [], []
    prev_epoch = 0
    for s, e in zip(strengths, epochs):
        if e > prev_epoch:
            if current:
                completed.append(np.mean(current))
            current = []
            prev_epoch = e
        current.append(float(s))
        if reading == "step":
            out.append(float(np.sum(strengths[:len(out) + 1], dtype=np.float64)))
        else:
            out.append(float(np.sum(completed) + np.mean(current)))
    return np.array(out)


@jax.jit
def _scan(strengths, epochs):
    """Both readings under jit, with a lax.scan over steps."""
    def step(carry, x):
        state_e, state_s = carry
        s, e = x
        state_e, cum_e = ev.tau_accumulate(state_e, s, e, reading="epoch")
        state_s, cum_s = ev.tau_accumulate(state_s, s, e, reading="step")
        return (state_e, state_s), (cum_e, cum_s)

    (_, _), (cum_e, cum_s) = jax.lax.scan(step, (ev.tau_init(), ev.tau_init()), (strengths, epochs))
    return cum_e, cum_s


def test_tau_accumulate_matches_python_simulation_for_both_readings():
    rng = np.random.default_rng(0)
    steps_per_epoch = np.array([7, 5, 9, 1, 6, 8])            # uneven epochs, one of a single step
    epochs = np.repeat(np.arange(6), steps_per_epoch).astype(np.int32)
    strengths = rng.uniform(2.0, 40.0, epochs.size).astype(np.float32)
    cum_e, cum_s = _scan(strengths, epochs)
    np.testing.assert_allclose(np.asarray(cum_e), _simulate(strengths, epochs, "epoch"), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(cum_s), _simulate(strengths, epochs, "step"), rtol=2e-6)
    # Skipped epoch indices (e.g. a resumed run) close the last epoch once.
    jumpy = np.array([0, 0, 3, 3, 7], np.int32)
    strengths = np.array([1.0, 3.0, 5.0, 7.0, 11.0], np.float32)
    cum_e, _ = _scan(strengths, jumpy)
    np.testing.assert_allclose(np.asarray(cum_e), [1.0, 2.0, 2.0 + 5.0, 2.0 + 6.0, 2.0 + 6 + 11])


def test_step_reading_reaches_full_weight_within_the_first_epoch():
    """S ~ 7.6 at initialisation, C_tau = 100: 13 steps sum to 98.8, the 14th to 106.4."""
    strengths = np.full(40, 7.6, np.float32)
    epochs = np.zeros(40, np.int32)
    _, cum_s = _scan(strengths, epochs)
    weight = 1.0 / np.asarray(jax.vmap(lambda c: ev.gedl_tau(c, 100.0))(cum_s))
    want = np.minimum(1.0, 7.6 * np.arange(1, 41) / 100.0)
    np.testing.assert_allclose(weight, want, rtol=1e-6)
    assert weight[12] < 1.0 and weight[13] == 1.0


def test_epoch_reading_with_strength_ten_gives_edl_like_ramp():
    """S = 10 every step, C_tau = 100: in epoch t the cumulative strength is 10 (t + 1), so the
    KL weight is min(1, (t + 1) / 10) throughout epoch t (EDL's min(1, t/10) shifted by one, since
    the current epoch is included)."""
    steps = 5
    epochs = np.repeat(np.arange(14), steps).astype(np.int32)
    strengths = np.full(epochs.size, 10.0, np.float32)
    cum_e, _ = _scan(strengths, epochs)
    weight = 1.0 / np.asarray(jax.vmap(lambda c: ev.gedl_tau(c, 100.0))(cum_e))
    np.testing.assert_allclose(weight, np.minimum(1.0, (epochs + 1) / 10.0), rtol=1e-6)
    np.testing.assert_allclose(weight, 1.0 / _tau64(_simulate(strengths, epochs, "epoch"), 100.0),
                               rtol=1e-6)


def _tau64(cumulative, c_tau):
    return np.maximum(1.0, c_tau / cumulative)


def test_gedl_tau_bounds_and_monotonicity():
    cumulative = np.concatenate([[0.0, 1e-38, 1e-3], np.logspace(-2, 6, 200)]).astype(np.float32)
    tau = np.asarray(jax.jit(ev.gedl_tau)(cumulative, 100.0), np.float64)
    assert np.all(np.isfinite(tau)) and np.all(tau >= 1.0)
    weight = 1.0 / tau
    assert np.all(weight > 0.0) and np.all(weight <= 1.0)
    assert np.all(np.diff(tau) <= 0)                          # more strength, less tempering
    np.testing.assert_allclose(tau[3:], _tau64(cumulative[3:].astype(np.float64), 100.0),
                               rtol=2e-7)
    assert tau[-1] == 1.0
    # tau is stop-gradient.
    assert float(jax.grad(lambda c: ev.gedl_tau(c, 100.0))(jnp.float32(5.0))) == 0.0


def test_tau_accumulate_is_stop_gradient_and_validates_reading():
    def cumulative(s):
        return ev.tau_accumulate(ev.tau_init(), s, 0)[1]

    assert float(jax.grad(cumulative)(jnp.float32(3.0))) == 0.0
    with pytest.raises(ValueError, match="epoch.*step"):
        ev.tau_accumulate(ev.tau_init(), 1.0, 0, reading="iteration")
    assert ev.TAU_READINGS == ("epoch", "step", "completed_epochs")


def test_tau_state_is_a_pytree_of_scalars_and_does_not_retrace():
    state = ev.tau_init()
    chex.assert_shape(jax.tree.leaves(state), ())
    assert [leaf.dtype for leaf in state] == [jnp.int32, jnp.float32, jnp.float32, jnp.int32,
                                              jnp.float32]

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(state, s, epoch):
        return ev.tau_accumulate(state, s, epoch)

    for i in range(6):
        state, _ = step(state, jnp.float32(1.0 + i), jnp.int32(i // 2))
    chex.assert_trees_all_equal_dtypes(state, ev.tau_init())
    assert int(state.epoch) == 2 and int(state.epoch_count) == 2
    np.testing.assert_allclose(float(state.completed_sum), 1.5 + 3.5)
    np.testing.assert_allclose(float(state.step_sum), 21.0)


class ScheduleJitTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_with_and_without_jit(self):
        @self.variant
        def weights(state, strength, epoch):
            state, cumulative = ev.tau_accumulate(state, strength, epoch, reading="epoch")
            return state, 1.0 / ev.gedl_tau(cumulative, 100.0), ev.edl_annealing(epoch)

        state = ev.tau_init()
        got = []
        for i, s in enumerate([7.0, 9.0, 12.0, 30.0, 55.0]):
            state, weight, anneal = weights(state, jnp.float32(s), jnp.int32(i // 2))
            got.append((float(weight), float(anneal)))
        cumulative = [7.0, 8.0, 8.0 + 12.0, 8.0 + 21.0, 8.0 + 21.0 + 55.0]
        want = [(min(1.0, c / 100.0), min(1.0, (i // 2) / 10.0)) for i, c in enumerate(cumulative)]
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6)


# ------------------------------------------------------ the other readings of Eq. tau_schedule


def test_completed_epochs_reading_counts_only_finished_epochs():
    """One term per finished epoch: 0 through epoch 0 (KL weight ~0, as EDL's), then the sum of
    the finished epochs' mean strengths, fixed within each epoch."""
    rng = np.random.default_rng(1)
    steps_per_epoch = np.array([4, 6, 3, 5])
    epochs = np.repeat(np.arange(4), steps_per_epoch).astype(np.int32)
    strengths = rng.uniform(2.0, 40.0, epochs.size).astype(np.float32)

    def step(state, x):
        state, cumulative = ev.tau_accumulate(state, x[0], x[1], reading="completed_epochs")
        return state, cumulative

    _, cum = jax.lax.scan(step, ev.tau_init(), (strengths, epochs))
    bounds = np.concatenate([[0], np.cumsum(steps_per_epoch)])
    means = [np.mean(strengths[a:b], dtype=np.float64) for a, b in zip(bounds[:-1], bounds[1:])]
    want = np.array([np.sum(means[:e]) for e in epochs])
    np.testing.assert_allclose(np.asarray(cum), want, rtol=2e-6)
    weight = 1.0 / np.asarray(jax.vmap(lambda c: ev.gedl_tau(c, 100.0))(cum))
    assert np.all(weight[epochs == 0] < 1e-20)
    np.testing.assert_allclose(weight[epochs > 0],
                               1.0 / np.maximum(1.0, 100.0 / want[epochs > 0]), rtol=1e-6)


def test_sum_over_c_form_is_the_inverse_reading():
    """tau = max(1, sum / C_tau): KL weight 1 until the sum passes C_tau, then C_tau / sum."""
    cumulative = np.array([1.0, 50.0, 100.0, 200.0, 1e4], np.float32)
    tau = np.asarray(ev.gedl_tau(cumulative, 100.0, form="sum_over_c"), np.float64)
    np.testing.assert_allclose(tau, np.maximum(1.0, cumulative.astype(np.float64) / 100.0),
                               rtol=1e-7)
    np.testing.assert_allclose(1.0 / tau, [1.0, 1.0, 1.0, 0.5, 0.01], rtol=1e-6)
    # The printed form on the same sums is its mirror image (weight rises instead of decays).
    printed = np.asarray(ev.gedl_tau(cumulative, 100.0), np.float64)
    np.testing.assert_allclose(1.0 / printed, [0.01, 0.5, 1.0, 1.0, 1.0], rtol=1e-6)
    with pytest.raises(ValueError, match="tau form"):
        ev.gedl_tau(cumulative, 100.0, form="inverse")
