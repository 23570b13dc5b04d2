"""The post-hoc OOD scores in `evaluate_model`: a "features_and_logits" predict function gets
every post-hoc score in its results (OOD detection, misclassification, selective), equal to the
scores computed directly from its outputs with fits on the training split alone; without the
option nothing changes; inputs the scores cannot use are refused early."""

import jax.numpy as jnp
import numpy as np
import pytest

from gedl_jax.evaluation import evaluate_model, metrics, posthoc

RNG = np.random.default_rng(0)
A = RNG.normal(size=(6, 8)).astype(np.float32)
W = RNG.normal(size=(8, 3)).astype(np.float32)
B = RNG.normal(size=3).astype(np.float32)
X, X_OOD, X_TRAIN = (RNG.normal(size=(n, 6)).astype(np.float32) for n in (60, 30, 200))
Y, Y_TRAIN = RNG.integers(0, 3, 60), RNG.integers(0, 3, 200)


def features_and_logits(x):
    f = jnp.tanh(jnp.asarray(x) @ A)
    return f, f @ W + B[None, :]


def direct(x):
    f, z = features_and_logits(x)
    return np.asarray(f, np.float64), np.asarray(z, np.float64)


def test_every_posthoc_score_reaches_the_results():
    options = posthoc.PosthocOptions(posthoc.POSTHOC_SCORE_NAMES, knn_k=5)
    got = evaluate_model(features_and_logits, (X, Y), {"o": X_OOD}, kind="features_and_logits",
                         train_data=(X_TRAIN, Y_TRAIN), last_layer=(W, B),
                         posthoc_options=options, batch_size=16)
    f_train, z_train = direct(X_TRAIN)
    fits = posthoc.fit_posthoc(options, f_train, Y_TRAIN, z_train, (W, B))
    f_test, z_test = direct(X)
    f_ood, z_ood = direct(X_OOD)
    expected_test = posthoc.posthoc_scores(options, fits, z_test, f_test)
    expected_ood = posthoc.posthoc_scores(options, fits, z_ood, f_ood)
    for name in posthoc.POSTHOC_SCORE_NAMES:
        # float32 batches of 16 against one float32 product: tiny differences only.
        np.testing.assert_allclose(got.predictions["test"].scores[name], expected_test[name],
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got.predictions["ood/o"].scores[name], expected_ood[name],
                                   rtol=1e-4, atol=1e-4)
        detection = got.results["ood"]["o"]["detection"][name]
        assert detection == metrics.ood_detection(got.predictions["test"].scores[name],
                                                  got.predictions["ood/o"].scores[name])
        assert name in got.results["id"]["selective"]
        assert name in got.results["id"]["misclassification"]
    # The logits' own scores are unchanged: "msp" is "mp" of the softmax.
    np.testing.assert_allclose(got.predictions["test"].scores["msp"],
                               got.predictions["test"].scores["mp"], rtol=1e-12)


def test_logit_scores_for_plain_logits_and_nothing_without_the_option():
    def logits(x):
        return features_and_logits(x)[1]

    plain = evaluate_model(logits, (X, Y), {"o": X_OOD}, kind="logits", batch_size=16)
    more = evaluate_model(logits, (X, Y), {"o": X_OOD}, kind="logits", batch_size=16,
                          posthoc_options=posthoc.PosthocOptions(("energy", "max_logit")))
    assert set(plain.predictions["test"].scores) == {"mp", "neg_entropy"}
    assert set(more.predictions["test"].scores) == {"mp", "neg_entropy", "energy", "max_logit"}
    assert more.results["ood"]["o"]["detection"]["mp"] == \
        plain.results["ood"]["o"]["detection"]["mp"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="probs", posthoc_options=posthoc.PosthocOptions(("energy",))), "kind"),
    (dict(kind="features_and_logits",
          posthoc_options=posthoc.PosthocOptions(("neg_knn_distance",))), "train_data"),
    (dict(kind="features_and_logits", train_data=(X_TRAIN, Y_TRAIN),
          posthoc_options=posthoc.PosthocOptions(("vim",))), "last linear layer"),
])
def test_unusable_inputs_are_refused(kwargs, message):
    fn = features_and_logits if kwargs["kind"] != "probs" else (
        lambda x: jnp.full((x.shape[0], 3), 1 / 3))
    with pytest.raises(ValueError, match=message):
        evaluate_model(fn, (X, Y), batch_size=16, **kwargs)


def test_unknown_scores_are_refused():
    with pytest.raises(ValueError, match="unknown post-hoc scores"):
        posthoc.PosthocOptions(("mahalanobis",))
