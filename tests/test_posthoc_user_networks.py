"""The post-hoc feature scores (Mahalanobis, KNN, ViM) on user networks: the features come from
the network's `features` / `features_and_logits` methods, ViM's last layer is the kernel and
bias pair that computes the logits from them (`posthoc.linear_head`, against NumPy-built
candidates), and a network without usable features, or whose logits no linear layer gives,
gets what it can with a line saying what was left out. The written scores are recomputed here
from features taken straight from the network."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from own_fixtures import write_image_data, write_user_package

from gedl_jax import config as config_lib
from gedl_jax import configs, data, evaluation
from gedl_jax.evaluation import posthoc
from gedl_jax.run import experiment, sharding, steps, workdir

RNG = np.random.default_rng(0)


# ------------------------------------------------------------------------- linear_head
def _problem(n=200, f=12, k=4):
    x = np.maximum(RNG.normal(size=(n, f)), 0.0)
    w, b = RNG.normal(size=(f, k)), RNG.normal(size=k)
    return x, w, b, x @ w + b


def test_linear_head_picks_the_pair_that_computes_the_logits():
    x, w, b, z = _problem()
    decoys = [(RNG.normal(size=(12, 4)), RNG.normal(size=4)),   # the right shapes, other values
              (RNG.normal(size=(7, 4)), RNG.normal(size=4)),    # another width
              (w, b[:3]), (w.T, b)]
    got = posthoc.linear_head([*decoys, (w, b), (w * 2, b)], x, z)
    assert got is not None and got[0] is not None
    np.testing.assert_array_equal(got[0], w)
    np.testing.assert_array_equal(got[1], b)
    assert posthoc.linear_head(decoys, x, z) is None


@pytest.mark.parametrize("rounding", ["float32", "tf32", "bfloat16"])
def test_linear_head_accepts_the_rounding_of_the_networks_precision(rounding):
    """Logits computed with inputs rounded to the mantissa of each precision (float32 24 bits,
    TF32 11, bfloat16 8), accumulated in float32: still this layer's."""
    x, w, b, _ = _problem()
    bits = {"float32": 24, "tf32": 11, "bfloat16": 8}[rounding]

    def rounded(a):
        m, e = np.frexp(a)
        return np.ldexp(np.round(m * 2.0 ** bits) / 2.0 ** bits, e)

    z = (rounded(x).astype(np.float32) @ rounded(w).astype(np.float32) + b).astype(np.float32)
    assert posthoc.linear_head([(w, b)], x, z) is not None


def test_linear_head_refuses_logits_no_linear_layer_gives():
    x, w, b, z = _problem()
    scale = np.abs(x) @ np.abs(w) + np.abs(b)   # what a product's rounding is relative to
    for other in (np.tanh(z), z + 0.5 * x[:, :4] ** 2, np.maximum(z, 0.0), z[:, ::-1],
                  z + 0.05 * scale * RNG.choice([-1.0, 1.0], size=z.shape)):   # 5 % off
        assert posthoc.linear_head([(w, b)], x, other) is None


# ----------------------------------------------------------------- a run's evaluation
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("posthoc_user")
    write_user_package(root / "pkg")
    return root / "pkg", write_image_data(root / "data", n_train=120, n_test=40)


@pytest.fixture
def userpkg(files, monkeypatch):
    monkeypatch.syspath_prepend(str(files[0]))
    return files


def _evaluate(userpkg, model: str, out, preset: str = "gedl"):
    _, (images, ood) = userpkg
    c = configs.build_config("custom", f"{preset},quick")
    config_lib.set_fields(c, dataset=f"npz:{images}", model=f"userpkg.nets:{model}",
                             ood_datasets=f"npz:{ood}", batch_size=16, plots=False,
                             eval_batch_size=32,
                             # float32 products (the suite's own): the written scores are
                             # checked against float64 ones from float32 features, and TF32's
                             # (a GPU's "default") moved them by up to 0.4 % on an H200
                             matmul_precision="highest")
    exp = experiment.Experiment.from_config(experiment.resolve_config(c, 1))
    out.mkdir(parents=True, exist_ok=True)
    mesh = sharding.make_mesh(jax.devices()[:1])
    state = jax.device_put(steps.init_train_state(exp.method, optax.adam(1e-3),
                                                  jax.random.PRNGKey(3),
                                                  exp.data.train.image_shape),
                           sharding.replicated(mesh))
    return exp, state, workdir.evaluate_and_write(exp, state, out, mesh=mesh)


def test_a_user_networks_features_give_every_feature_score(userpkg, tmp_path):
    exp, state, results = _evaluate(userpkg, "NNXCNN", tmp_path)
    assert results["posthoc"]["scores"] == list(posthoc.POSTHOC_SCORE_NAMES)
    saved = evaluation.load_posthoc_scores(tmp_path / "predictions.npz")

    def direct(split: data.Split):
        x = data.to_float(split.images)
        model = exp.method.eval_model
        return (np.asarray(model.apply(state.variables, x, method="features"), np.float64),
                np.asarray(model.apply(state.variables, x), np.float64))

    f_train, z_train = direct(exp.data.train)
    f_test, z_test = direct(exp.data.test)
    params = state.variables["params"]
    head = (np.asarray(params["head"]["kernel"], np.float64),
            np.asarray(params["head"]["bias"], np.float64))
    options = posthoc.PosthocOptions(posthoc.FEATURE_SCORE_NAMES)
    fits = posthoc.fit_posthoc(options, f_train, exp.data.train.labels, z_train, head)
    want = posthoc.posthoc_scores(options, fits, z_test, f_test)
    for name in posthoc.FEATURE_SCORE_NAMES:
        np.testing.assert_allclose(saved["test"][name], want[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)


def test_what_a_user_network_cannot_give_is_left_out_with_a_line(userpkg, tmp_path, capsys):
    _, _, results = _evaluate(userpkg, "SquashedHead", tmp_path / "squashed")
    assert results["posthoc"]["scores"] == [n for n in posthoc.POSTHOC_SCORE_NAMES if n != "vim"]
    assert "vim left out: no layer of the network computes its logits" in capsys.readouterr().out
    _, _, results = _evaluate(userpkg, "BrokenFeatures", tmp_path / "broken")
    assert results["posthoc"]["scores"] == list(posthoc.LOGIT_SCORE_NAMES)
    out = capsys.readouterr().out
    assert "post-hoc feature scores left out: network 'userpkg.nets:BrokenFeatures'" in out
    _, _, results = _evaluate(userpkg, "NoFeatures", tmp_path / "none", preset="softmax")
    assert results["posthoc"]["scores"] == list(posthoc.LOGIT_SCORE_NAMES)
