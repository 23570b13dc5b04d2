"""Evidence activations against NumPy float64, at extreme logits, with gradients, jit == no-jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from gedl_jax import evidential as ev

# float32 rounding of a correctly computed elementwise function: a few ulps.
RTOL = 4 * float(np.finfo(np.float32).eps)


LOGITS = np.array([[-1e3, -50.0, -10.5, -1.0, 0.0],
                   [1e-3, 1.0, 9.99, 10.5, 1e3]], np.float32)


def _reference(name, x, clip=10.0):
    x = np.asarray(x, np.float64)
    if name == "softplus":
        return np.logaddexp(0.0, x)
    if name == "relu":
        return np.maximum(x, 0.0)
    return np.exp(np.clip(x, -clip, clip))


@pytest.mark.parametrize("name", ev.ACTIVATIONS)
def test_values_match_numpy_and_dispatch(name):
    direct = {"softplus": ev.softplus_evidence, "relu": ev.relu_evidence,
              "exp": ev.exp_evidence}[name](LOGITS)
    dispatched = ev.evidence_from_logits(LOGITS, name)
    want = _reference(name, LOGITS)
    np.testing.assert_allclose(np.asarray(direct, np.float64), want, rtol=RTOL, atol=0)
    np.testing.assert_array_equal(np.asarray(direct), np.asarray(dispatched))
    assert direct.shape == LOGITS.shape and direct.dtype == jnp.float32
    assert np.all(np.asarray(direct) >= 0)


def test_exp_clip_is_configurable():
    got = ev.evidence_from_logits(LOGITS, "exp", exp_clip=3.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), _reference("exp", LOGITS, 3.0),
                               rtol=RTOL)
    assert float(jnp.max(got)) == pytest.approx(np.exp(3.0), rel=RTOL)


@pytest.mark.parametrize("name", ev.ACTIVATIONS)
def test_finite_gradients_at_extreme_logits(name):
    def total(x):
        return jnp.sum(ev.evidence_from_logits(x, name))

    grad = np.asarray(jax.grad(total)(jnp.asarray(LOGITS)))
    assert np.all(np.isfinite(grad))
    x = LOGITS.astype(np.float64)
    if name == "softplus":      # sigmoid
        want = special.expit(x)
    elif name == "relu":
        want = (x > 0).astype(np.float64)
    else:                       # exp inside the clamp, 0 outside
        want = np.where(np.abs(x) < 10.0, np.exp(np.clip(x, -10, 10)), 0.0)
    np.testing.assert_allclose(grad, want, rtol=RTOL, atol=1e-30)


@pytest.mark.parametrize("name", ev.ACTIVATIONS)
def test_jit_matches_eager(name):
    fn = jax.jit(ev.evidence_from_logits, static_argnums=1)
    np.testing.assert_array_equal(np.asarray(fn(LOGITS, name)),
                                  np.asarray(ev.evidence_from_logits(LOGITS, name)))


def test_unknown_activation_names_allowed_values():
    with pytest.raises(ValueError, match="softplus.*relu.*exp"):
        ev.evidence_from_logits(LOGITS, "sigmoid")
