"""Property-based tests (hypothesis): over batch sizes, K, logits anywhere in [-1e4, 1e4] and any
valid labels, every variant's loss, its gradient, and every uncertainty measure stay finite.

The loss and gradient are jitted as training runs them, every distinct loss spec (the 25 presets
and options give 15) in one program per class count (K is drawn from three values, the rows are
fixed), compiled with XLA's optimisations mostly off and reused across the drawn examples. The
uncertainty measures run eagerly (many small functions), once per example for each distinct set
of outputs (many presets share their evidence function and prior, so their alpha, evidence and
W).
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gedl_jax import config as config_lib
from gedl_jax import configs, evaluation
from gedl_jax import evidential as ev
from gedl_jax.evidential import loss as losses
from gedl_jax.methods.evidential import spec_from_config

# No shrinking: a failure is reported with the example as drawn, in seconds rather than minutes
# (the message names the variant and the offending values).
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    phases=(Phase.explicit, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LOGIT = st.floats(-1e4, 1e4, allow_nan=False, width=32)
ROWS = 6  # fixed, so eager execution reuses its compiled primitives across examples
# Every preset (MNIST protocol), RED under the CIFAR protocol (exp clip 10 instead of 80), and
# the options no preset uses, on GEDL.
SPECS = ([(v, "mnist", {}) for v in sorted(config_lib.VARIANTS)] + [("red", "cifar10", {})]
         + [("gedl", "mnist", extra) for extra in (
             {"likelihood": "log"}, {"evidence": "relu"}, {"evidence": "exp"},
             {"tau_reading": "step"}, {"warmup_epochs": 1}, {"base_rate": "label_frequency"})])


@st.composite
def problems(draw):
    """(logits ROWS x K in [-1e4, 1e4], labels): drawn rows plus extreme ones on purpose."""
    k = draw(st.sampled_from([2, 10, 100]))
    logits = np.asarray(draw(st.lists(LOGIT, min_size=ROWS * k, max_size=ROWS * k)),
                        np.float32).reshape(ROWS, k)
    for row in range(ROWS):
        pattern = draw(st.sampled_from(["drawn", "all_max", "all_min", "one_max", "mixed"]))
        if pattern == "all_max":
            logits[row] = 1e4
        elif pattern == "all_min":
            logits[row] = -1e4
        elif pattern == "one_max":
            logits[row] = -1e4
            logits[row, draw(st.integers(0, k - 1))] = 1e4
        elif pattern == "mixed":
            logits[row, ::2], logits[row, 1::2] = 1e4, -1e4
    labels = np.asarray(draw(st.lists(st.integers(0, k - 1), min_size=ROWS, max_size=ROWS)),
                        np.int32)
    return logits, labels


def _spec(variant, dataset, extra, k):
    c = configs.build_config(dataset, variant)
    c.num_classes = k
    for field, value in extra.items():
        c[field] = value
    base_rate = None
    if c.base_rate == "label_frequency":
        freq = np.arange(1, k + 1, dtype=np.float64)
        base_rate = tuple(float(x) for x in freq / freq.sum())
    return spec_from_config(c, base_rate=base_rate)


def _assert_finite(tree, what):
    for path, leaf in jax.tree.leaves_with_path(tree):
        leaf = np.asarray(leaf)
        assert np.all(np.isfinite(leaf)), f"{what}{jax.tree_util.keystr(path)}: {leaf}"


def _distinct_specs(k: int) -> dict:
    """{loss spec: the name of its first entry in SPECS} for K classes (presets with the same
    loss spec, such as ablation_full and gedl, once)."""
    named = {}
    for variant, dataset, extra in SPECS:
        named.setdefault(_spec(variant, dataset, extra, k), f"{variant}/{dataset}/{extra}")
    return named


@functools.cache
def _loss_and_gradient(specs: tuple) -> Callable:
    """Each spec's ((mean loss, (loss_B, new tau, terms)), gradient), jitted as one program: one
    compilation per K instead of one per spec (`pytest --durations` on 2 CPU cores, this test
    alone: 22 s instead of 44 s)."""
    def mean_loss(spec, logits_BxK, labels_B, epoch):
        loss_B, new_tau, terms = losses.per_example_loss(spec, logits_BxK, labels_B,
                                                         ev.tau_init(), epoch)
        return jnp.mean(loss_B), (loss_B, new_tau, terms)

    def every_spec(logits_BxK, labels_B, epoch):
        return tuple(jax.value_and_grad(functools.partial(mean_loss, spec), has_aux=True)(
            logits_BxK, labels_B, epoch) for spec in specs)

    return jax.jit(every_spec)


@settings(SETTINGS, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
@given(problem=problems(), epoch=st.integers(0, 300))
def test_every_variant_loss_and_gradient_are_finite(problem, epoch, fast_compile):
    logits, labels = problem
    named = _distinct_specs(logits.shape[1])
    outputs = _loss_and_gradient(tuple(named))(jnp.asarray(logits), jnp.asarray(labels),
                                                jnp.int32(epoch))
    for name, ((_, aux), grad) in zip(named.values(), outputs, strict=True):
        _assert_finite(aux, f"{name} loss")
        _assert_finite(grad, f"{name} gradient")


@SETTINGS
@given(problem=problems())
def test_every_uncertainty_measure_is_finite(problem):
    logits, _ = problem
    checked = set()   # the measures are functions of the outputs: once per distinct outputs
    for variant, dataset, extra in SPECS:
        spec = _spec(variant, dataset, extra, logits.shape[1])
        out = losses.evidential_outputs(spec, jnp.asarray(logits))
        _assert_finite(out, "evidential outputs")
        inputs = tuple(np.asarray(x).tobytes() for x in jax.tree.leaves(out)) + (
            np.asarray(losses.base_rate_K(spec)).tobytes(),)
        if inputs in checked:
            continue
        checked.add(inputs)
        alpha = out.alpha_BxK
        # The float32 functions as training and the library use them ...
        for fn in (ev.predictive_entropy, ev.expected_entropy, ev.mutual_information,
                   ev.differential_entropy, ev.variance_sum, ev.max_probability,
                   ev.dirichlet_strength, ev.fisher_logdet):
            _assert_finite(fn(alpha), f"{variant}/{extra} {fn.__name__}")
        _assert_finite(ev.total_evidence(out.evidence_BxK), "total_evidence")
        _assert_finite(ev.uncertainty_mass(alpha, out.prior_strength_B), "uncertainty_mass")
        _assert_finite(ev.subjective_opinion(out.evidence_BxK, out.prior_strength_B,
                                             losses.base_rate_K(spec)), "subjective_opinion")
        # ... and the evaluation's float64 measures and OOD scores.
        alpha64 = np.asarray(alpha, np.float64)
        w64 = np.asarray(out.prior_strength_B, np.float64)
        _assert_finite(evaluation.uncertainty_measures(alpha64, w64), "uncertainty_measures")
        _assert_finite(evaluation.confidence_scores(alpha64, w64), "confidence_scores")
