"""methods/laplace.py (config.method="laplace"): its fit and on-device predictive against the
float64 closed form of evaluation/laplace.py, its errors, and a softmax run evaluated as a
Laplace run without retraining (`gedl_jax.evaluate --as_method=laplace`)."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from own_fixtures import write_user_package
from training_fixtures import (
    REPO,
    assert_same_tree,
    cli_args,
    saved_state,
    subprocess_env,
    write_tiny_mnist,
)

from gedl_jax import config as config_lib
from gedl_jax import configs, methods
from gedl_jax.evaluation import laplace as closed_form
from gedl_jax.methods import laplace as laplace_method

K, SHAPE = 10, (28, 28, 1)


def _config(**method_args):
    c = configs.build_config("mnist", "laplace")
    if method_args:
        c.method_args = json.dumps(method_args)
    return c


def _method(**method_args) -> methods.Method:
    setup = methods.MethodSetup.from_labels(np.arange(K).repeat(3), K, SHAPE)
    return methods.from_config(_config(**method_args), setup)


@pytest.fixture(scope="module")
def tiny():
    """A randomly initialised ConvNet, 120 training and 60 validation images, their float64
    penultimate features and the trained (here: initial) last layer."""
    method = _method()
    variables = method.init(jax.random.PRNGKey(0), SHAPE)
    rng = np.random.default_rng(0)
    images = rng.normal(size=(180, *SHAPE)).astype(np.float32)
    labels = rng.integers(0, K, 180)
    with jax.default_matmul_precision("highest"):
        feats = np.asarray(jax.jit(method.posthoc_outputs)(variables, images)["features_BxF"],
                           np.float64)
    return dict(method=method, variables=variables, images=images, labels=labels,
                features=feats, last=method.last_layer(variables),
                train=[(images[i:i + 40], labels[i:i + 40]) for i in range(0, 120, 40)],
                val=[(images[120:], labels[120:])])


def test_fit_and_probit_prediction_equal_the_float64_closed_form(tiny):
    method = tiny["method"]
    with jax.default_matmul_precision("highest"):
        state = method.fit(tiny["variables"], {}, tiny["train"], tiny["val"])
        probs = np.asarray(method.predict(tiny["variables"], state, tiny["images"],
                                          jax.random.PRNGKey(1))["probs_BxK"], np.float64)
    feats = tiny["features"]
    reference, nlls = closed_form.fit_prior_precision(feats[:120], *tiny["last"], feats[120:],
                                                      tiny["labels"][120:])
    assert float(state["prior_precision"]) == pytest.approx(reference.prior_precision)
    assert float(state["validation_nll"]) == pytest.approx(nlls[reference.prior_precision],
                                                           rel=1e-6)
    expected = closed_form.predictive(reference, feats, "probit")
    np.testing.assert_allclose(probs, expected, atol=2e-6)
    # the posterior changes the prediction: not the plain softmax of the same logits
    plain = closed_form.special.softmax(feats @ tiny["last"][0] + tiny["last"][1], axis=1)
    assert np.abs(expected - plain).max() > 1e-3


def _wide_posterior(tiny) -> closed_form.LastLayerLaplace:
    """A weak prior on a small training set: logit variances of order 1 and more."""
    return closed_form.fit_last_layer_laplace(tiny["features"][:120], *tiny["last"], 0.05)


def test_logit_covariance_and_variances_equal_the_closed_form(tiny):
    fit = _wide_posterior(tiny)
    a = fit.theta_AxK.shape[0]
    cov = jax.numpy.asarray(fit.covariance_PxP.reshape(a, K, a, K), jax.numpy.float32)
    feats = jax.numpy.asarray(tiny["features"], jax.numpy.float32)
    _, expected = closed_form.logit_distribution(fit, tiny["features"])
    sigma = np.asarray(laplace_method.logit_covariance(feats, cov), np.float64)
    scale = np.abs(expected).max()
    assert scale > 1.0
    np.testing.assert_allclose(sigma, expected, atol=1e-5 * scale)
    np.testing.assert_allclose(np.asarray(laplace_method.logit_variances(feats, cov)),
                               np.einsum("nkk->nk", expected), atol=1e-5 * scale)


def test_mc_predictive_agrees_with_float64_monte_carlo():
    """Logits of scale 3 with covariances of scale 4: 20,000 draws (standard error at most
    0.5 / sqrt(20,000) = 0.0035) against 400,000 in float64."""
    rng = np.random.default_rng(5)
    mean = 3.0 * rng.normal(size=(30, K))
    factors = rng.normal(size=(30, K, K)) * 2.0 / np.sqrt(K)
    sigma = factors @ np.swapaxes(factors, 1, 2) + 0.1 * np.eye(K)[None]
    chol = np.linalg.cholesky(sigma)
    reference = np.zeros((30, K))
    for _ in range(8):   # 8 x 50,000 draws, a chunk at a time (a few hundred MB, not 2 GB)
        draws = mean[None] + np.einsum("nkj,snj->snk", chol,
                                       rng.standard_normal((50_000, 30, K)))
        reference += closed_form.special.softmax(draws, axis=2).mean(axis=0) / 8
    ours = np.asarray(laplace_method.mc_predictive(
        jax.numpy.asarray(mean, jax.numpy.float32), jax.numpy.asarray(sigma, jax.numpy.float32),
        jax.random.PRNGKey(3), 20_000))
    np.testing.assert_allclose(ours.sum(axis=1), 1.0, atol=1e-5)
    assert np.abs(ours - reference).max() < 0.015
    plain = closed_form.special.softmax(mean, axis=1)
    assert np.abs(reference - plain).max() > 0.1   # the check above can tell them apart


def test_the_mc_method_fits_and_predicts_as_the_closed_form(tiny):
    method = _method(predictive="mc", num_samples=4000)
    with jax.default_matmul_precision("highest"):
        state = method.fit(tiny["variables"], {}, tiny["train"], tiny["val"])
        probs = np.asarray(method.predict(tiny["variables"], state, tiny["images"][:40],
                                          jax.random.PRNGKey(1))["probs_BxK"])
    feats = tiny["features"]
    reference, _ = closed_form.fit_prior_precision(feats[:120], *tiny["last"], feats[120:],
                                                   tiny["labels"][120:], kind="mc",
                                                   num_samples=4000)
    assert float(state["prior_precision"]) == pytest.approx(reference.prior_precision)
    expected = closed_form.predictive(reference, feats[:40], "mc", num_samples=100_000)
    assert np.abs(probs - expected).max() < 0.03   # 4,000 draws: standard error <= 0.008


def test_laplax_computes_the_same_ggn_and_posterior():
    """laplax (an independent implementation of the GGN, its posterior and the probit
    predictive, "mean_field_0") against the closed form, all in float64."""
    pytest.importorskip("laplax", reason="laplax is in the dev extra (pip install laplax)")
    from laplax.eval.predictives import mean_field_0_predictive

    rng = np.random.default_rng(4)
    feats, weight, bias = rng.normal(size=(90, 6)), rng.normal(size=(6, 4)), rng.normal(size=4)
    ggn = laplace_method.laplax_last_layer_ggn(feats, weight, bias)
    expected = closed_form.last_layer_ggn(feats, weight, bias)
    np.testing.assert_allclose(ggn, expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    fit = closed_form.fit_last_layer_laplace(feats, weight, bias, 0.3)
    mean, sigma = closed_form.logit_distribution(fit, feats[:10])
    with jax.enable_x64(True):
        theirs = np.asarray(jax.vmap(mean_field_0_predictive)(
            jax.numpy.asarray(mean), jax.numpy.asarray(np.einsum("nkk->nk", sigma))))
    np.testing.assert_allclose(closed_form.predictive(fit, feats[:10], "probit"), theirs,
                               rtol=1e-12)


def test_the_laplax_curvature_fits_as_the_closed_form(tiny):
    pytest.importorskip("laplax", reason="laplax is in the dev extra (pip install laplax)")
    method = _method(curvature="laplax")
    assert method.describe() == "last-layer Laplace (probit, GGN by laplax)"
    with jax.default_matmul_precision("highest"):
        state = method.fit(tiny["variables"], {}, tiny["train"], tiny["val"])
        default = tiny["method"].fit(tiny["variables"], {}, tiny["train"], tiny["val"])
    assert float(state["prior_precision"]) == float(default["prior_precision"])
    np.testing.assert_allclose(state["covariance_AxKxAxK"], default["covariance_AxKxAxK"],
                               rtol=1e-5, atol=1e-7)


def test_the_laplax_curvature_without_laplax_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "laplax.api", None)   # an import of it fails
    with pytest.raises(ImportError, match="pip install laplax.*curvature='closed_form'"):
        laplace_method.laplax_last_layer_ggn(np.ones((3, 2)), np.ones((2, 2)), np.ones(2))
    with pytest.raises(ValueError, match="curvature='kfac' is not allowed"):
        _method(curvature="kfac")


def test_settings_networks_and_splits_it_cannot_use_are_errors(tiny):
    with pytest.raises(ValueError, match="predictive='bridge' is not allowed"):
        _method(predictive="bridge")
    with pytest.raises(ValueError, match="num_samples=0 is not allowed"):
        _method(num_samples=0)
    with pytest.raises(ValueError, match="val_fraction"):
        tiny["method"].fit(tiny["variables"], {}, tiny["train"], ())


@pytest.fixture
def userpkg(tmp_path, monkeypatch):
    write_user_package(tmp_path / "pkg")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))


def _user_laplace(model: str, k: int, shape: tuple[int, ...]) -> methods.Method:
    c = _config()
    config_lib.set_fields(c, model=model, num_classes=k)
    methods.check_config(c)
    setup = methods.MethodSetup.from_labels(np.arange(k).repeat(3), k, shape)
    return methods.from_config(c, setup)


def test_a_user_network_fits_with_the_layer_that_computes_its_logits():
    """The built-in MLP (a user network): its `features` and the "head" Dense layer, found as
    the kernel and bias pair with f W + b = its logits, give the float64 closed form's fit."""
    k, shape = 4, (6,)
    method = _user_laplace("mlp", k, shape)
    variables = method.init(jax.random.PRNGKey(0), shape)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(150, *shape)).astype(np.float32)
    y = rng.integers(0, k, 150)
    with jax.default_matmul_precision("highest"):
        state = method.fit(variables, {}, [(x[:100], y[:100])], [(x[100:], y[100:])])
        f = np.asarray(method.eval_model.apply(variables, x, method="features"), np.float64)
    head = variables["params"]["head"]
    reference, _ = closed_form.fit_prior_precision(
        f[:100], np.asarray(head["kernel"], np.float64), np.asarray(head["bias"], np.float64),
        f[100:], y[100:])
    assert float(state["prior_precision"]) == pytest.approx(reference.prior_precision)
    a = reference.theta_AxK.shape[0]
    np.testing.assert_allclose(np.asarray(state["covariance_AxKxAxK"], np.float64),
                               reference.covariance_PxP.reshape(a, k, a, k), rtol=1e-4,
                               atol=1e-7)


def test_a_user_network_without_a_linear_last_layer_or_features_is_refused(userpkg):
    from gedl_jax.methods import common

    method = _user_laplace("userpkg.nets:SquashedHead", 3, (8, 8, 1))
    variables = method.init(jax.random.PRNGKey(0), (8, 8, 1))
    x = np.random.default_rng(2).normal(size=(40, 8, 8, 1)).astype(np.float32)
    y = np.arange(40) % 3
    with pytest.raises(ValueError, match=r"needs a last layer that computes the logits"):
        method.fit(variables, {}, [(x[:30], y[:30])], [(x[30:], y[30:])])
    c = _config()   # before the first step: the features contract
    config_lib.set_fields(c, model="userpkg.nets:NoFeatures", num_classes=3)
    with pytest.raises(ValueError, match="features"):
        common.check_user_network(methods.resolved(c), laplace_method.LastLayerLaplace, 3,
                                  (8, 8, 1))


def test_only_a_run_of_the_method_it_trains_as_evaluates_as_it():
    assert methods.evaluated_as("laplace", "softmax")["method"] == "laplace"
    with pytest.raises(ValueError, match="can be evaluated as: \\['laplace'\\]"):
        methods.evaluated_as("duq", "softmax")
    with pytest.raises(ValueError, match="no other method"):
        methods.evaluated_as("laplace", "evidential")


def test_a_softmax_run_evaluates_as_laplace_without_retraining(tmp_path):
    data_dir = write_tiny_mnist(tmp_path / "data")
    env = subprocess_env(tmp_path / "cache")
    workdir = tmp_path / "w"
    trained = subprocess.run(cli_args(workdir, data_dir, "softmax", num_epochs=1,
                                      allow_chance=True, evaluate_at_end=True),
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    own = (workdir / "eval_results.json").read_bytes()

    def evaluate(*args):
        return subprocess.run([sys.executable, "-m", "gedl_jax.evaluate",
                               f"--workdir={workdir}", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)

    proc = evaluate("--as_method=laplace")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((workdir / "as_laplace" / "eval_results.json").read_text())
    assert results["method"] == "last-layer Laplace (probit)"
    assert results["variant"] == "laplace"
    chosen = results["fit"]["prior_precision"]   # a grid point, kept in float32
    assert min(abs(g - chosen) / g for g in closed_form.PRIOR_PRECISION_GRID) < 1e-6
    assert results["fit"]["validation_nll"] > 0
    assert (workdir / "eval_results.json").read_bytes() == own   # the run's own, untouched
    # a laplace run trains as the softmax run, bit for bit, and evaluates to the same numbers
    own_laplace = tmp_path / "laplace"
    trained = subprocess.run(cli_args(own_laplace, data_dir, "laplace", num_epochs=1,
                                      allow_chance=True, evaluate_at_end=True),
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert_same_tree(saved_state(own_laplace)[0], saved_state(workdir)[0])
    direct = json.loads((own_laplace / "eval_results.json").read_text())
    assert direct["id"] == results["id"]
    # --calibrate: the calibrators' comparison (with SmoothECE), into --out
    proc = evaluate("--as_method=laplace", "--calibrate", f"--out={tmp_path / 'calibrated'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calibrated = json.loads((tmp_path / "calibrated" / "eval_results.json").read_text())
    assert calibrated["evaluation_options"]["calibrate"] is True
    assert {"none", "temperature", "isotonic"} <= set(calibrated["calibrators"]["after"]) | {"none"}
    assert "smooth_ece" in calibrated["calibrators"]["before"]
    assert "SmoothECE" in proc.stdout
    proc = evaluate("--as_method=duq")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --as_method=duq")
