"""The method interface end to end on generated arrays: the worked example of
docs/architecture.md (a temperature-scaled softmax) trained by the real step, predicted by the real
predictor, scored by `evaluate_predictions`; and what every registered method must satisfy."""

import dataclasses
import json
import re
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from gedl_jax import config as config_lib
from gedl_jax import configs, data, evaluation, methods, train
from gedl_jax.run import inference, sharding, steps

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _documented_example() -> dict:
    """Execute the method class of docs/architecture.md's worked example as written."""
    text = ARCHITECTURE.read_text()
    code = re.search(r"```python\n# gedl_jax/methods/tempered.py\n(.*?)```", text, re.S).group(1)
    assert "def build(cls, config, setup" in code   # the class carries its builder
    namespace: dict = {}
    exec(compile(code, "docs/architecture.md", "exec"), namespace)  # noqa: S102
    return namespace


def _tiny_data(n=64, k=3, seed=0):
    """Learnable 8x8 images: class c lights up row c."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n).astype(np.int32)
    images = rng.integers(0, 40, (n, 8, 8, 1)).astype(np.uint8)
    images[np.arange(n), labels * 2, :, 0] = 255
    return data.Split(images, labels, "tiny")


class _TinyNet(__import__("flax").linen.Module):
    num_classes: int = 3

    @__import__("flax").linen.compact
    def __call__(self, x, train=False, dropout=None):
        import flax.linen as nn
        return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


def test_worked_example_from_its_preset_through_training(generated_data_files, tmp_path,
                                                          monkeypatch):
    """Adding the method is its file, one line of the method table and its preset (the doc's
    words); then the trainer runs it from the preset like any built-in method."""
    example = _documented_example()
    monkeypatch.setitem(methods.METHODS, "tempered", example["Tempered"])
    monkeypatch.setitem(config_lib.VARIANTS, "tempered",
                        {"method": "tempered"})
    with generated_data_files.registered() as root:
        c = configs.build_config("mnist", "tempered")
        for key, value in {"data_dir": str(root), "train_examples": 256, "val_examples": 64,
                           "batch_size": 32, "num_epochs": 2, "eval_batch_size": 64,
                           "eval_examples": 64, "ood_datasets": "kmnist", "plots": False,
                           "learning_rate": 3e-3}.items():
            config_lib.set_fields(c, **{key: value})
        config_lib.validate(c)
        summary = train.train_and_evaluate(c, tmp_path)
    assert summary["steps"] == 16
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results["scores"] == ["mp", "neg_entropy"] and results["id"]["accuracy"] > 0.25
    setup = methods.MethodSetup(10, (5,) * 10, (28, 28, 1))
    assert "Tempered" in type(methods.from_config(c, setup)).__name__
    assert methods.from_config(c, setup).temperature == 2.0
    c.method_args = '{"temperature": 3}'       # its setting, from the command line's JSON
    assert methods.from_config(c, setup).temperature == 3.0
    c.method_args = '{"temperature": 0}'
    with pytest.raises(ValueError, match=r"method_args: temperature=0.0 .*must be > 0"):
        methods.check_config(c)


def test_documented_worked_example_trains_and_evaluates():
    tempered = _documented_example()["Tempered"]
    method = tempered(_TinyNet(), _TinyNet(), 3, temperature=2.0)
    split = _tiny_data()
    mesh = sharding.make_mesh(jax.devices()[:1])
    tx = optax.adam(0.05)
    settings = steps.StepSettings(steps_per_epoch=4, batch_size=16, augment=False,
                                  normalize_mean=None, normalize_std=None)
    keys = {"augment": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)}
    state = jax.device_put(steps.init_train_state(method, tx, jax.random.PRNGKey(0), (8, 8, 1)),
                           sharding.replicated(mesh))   # as the trainer places it
    step = steps.make_train_step(method, tx, mesh, settings, keys)
    images = sharding.put_replicated(mesh, split.images)
    labels = sharding.put_replicated(mesh, split.labels)
    order = jnp.arange(64, dtype=jnp.int32)
    losses = []
    for _ in range(40):
        state, metrics = step(state, images, labels, order)
        losses.append(float(metrics["loss"]))
    assert step._cache_size() == 1                    # no retracing
    assert set(metrics) >= {"loss", "accuracy", "grad_norm", "nonfinite"}
    assert losses[-1] < 0.5 * losses[0]
    raw = inference.predict_split(steps.make_predict_step(method, mesh), state.variables,
                                  state.method_state, mesh, split, batch_size=24)
    chex.assert_shape(raw["probs_BxK"], (64, 3))      # padded to 72, every example once
    predictions = method.predictions(raw, split.labels)
    results = evaluation.evaluate_predictions(predictions, {"noise": method.predictions(raw)})
    assert results["id"]["accuracy"] > 0.9
    assert results["scores"] == ["mp", "neg_entropy"] and "uncertainty" not in results["id"]


# One preset per method (the EDL presets share one method; tests/test_train.py trains every
# preset end to end).
_ONE_PER_METHOD = {}
for _name, _fields in config_lib.VARIANTS.items():
    _ONE_PER_METHOD.setdefault(_fields.get("method", "evidential"), _name)


@pytest.mark.parametrize("preset", sorted(_ONE_PER_METHOD.values()))
def test_every_preset_builds_a_method_whose_loss_and_predictions_fit_the_interface(preset):
    config = configs.build_config("mnist", preset)
    method = methods.from_config(config, methods.MethodSetup(10, (5,) * 10, (28, 28, 1)))
    hash(method)                                       # static argument of jit: hashable
    variables = dict(method.init(jax.random.PRNGKey(0), (28, 28, 1)))
    params = variables.pop("params")
    images = jax.random.uniform(jax.random.PRNGKey(1), (4, 28, 28, 1))
    labels = jnp.array([0, 1, 2, 3], jnp.int32)
    ctx = methods.StepContext(epoch=jnp.int32(0), key=jax.random.PRNGKey(3))
    # Inside shard_map over the "data" axis, as the trainer runs it (PostNet's latent BatchNorm
    # averages over it even on MNIST).
    local = jax.shard_map(lambda p: method.loss(p, variables, method.init_method_state(),
                                                images, labels, ctx),
                          mesh=jax.make_mesh((1,), ("data",)), in_specs=P(), out_specs=P())
    out = jax.jit(local)(params)
    chex.assert_shape(out.loss_B, (4,))
    chex.assert_tree_all_finite(out.loss_B)
    assert out.logs["correct_B"].shape == (4,)
    raw = jax.jit(method.predict)({"params": params, **variables}, method.init_method_state(),
                                  images, jax.random.PRNGKey(4))
    predictions = method.predictions({k: np.asarray(v) for k, v in raw.items()},
                                     np.asarray(labels))
    assert tuple(predictions.scores) == method.score_names or set(predictions.scores) == set(
        method.score_names)
    # "um" where there is a precision: a Dirichlet's, or F-EDL's Flexible Dirichlet's.
    assert ("um" in predictions.scores) == (predictions.is_dirichlet or method.name == "fedl")
    # what its "mp" is, as the method declares it, carried in its predictions and true
    assert predictions.mp_is_max_probability is method.mp_is_max_probability
    assert np.allclose(predictions.scores["mp"], predictions.probs.max(1), rtol=0.0,
                       atol=1e-9) is method.mp_is_max_probability
    np.testing.assert_array_equal(method.predicted_class({k: np.asarray(v) for k, v in
                                                          raw.items()}),
                                  np.argmax(predictions.probs, -1))


def test_mc_dropout_passes_differ_and_p0_is_the_deterministic_net():
    config = configs.build_config("mnist", "mc_dropout")
    setup = methods.MethodSetup(10, (5,) * 10, (28, 28, 1))
    method = methods.from_config(config, setup)
    variables = method.init(jax.random.PRNGKey(0), (28, 28, 1))
    images = jax.random.uniform(jax.random.PRNGKey(1), (5, 28, 28, 1))
    probs = method.predict(variables, {}, images, jax.random.PRNGKey(2))["probs_BxTxK"]
    chex.assert_shape(probs, (5, 10, 10))
    assert float(jnp.max(jnp.abs(probs[:, 0] - probs[:, 1]))) > 1e-4   # fresh masks per pass
    again = method.predict(variables, {}, images, jax.random.PRNGKey(2))["probs_BxTxK"]
    np.testing.assert_array_equal(probs, again)                          # same key, same passes
    no_drop = dataclasses.replace(method, eval_model=method.eval_model.clone(dropout_rate=0.0))
    deterministic = methods.from_config(configs.build_config("mnist", "softmax"), setup)
    p0 = no_drop.predict(variables, {}, images, jax.random.PRNGKey(2))["probs_BxTxK"]
    expected = deterministic.predict(variables, {}, images, None)["probs_BxK"]
    np.testing.assert_allclose(p0, jnp.repeat(expected[:, None], 10, axis=1), rtol=1e-6)


def test_ensemble_combines_member_probabilities_and_scores_their_disagreement():
    from gedl_jax.run import ensemble

    p1 = np.array([[0.9, 0.1], [0.5, 0.5]])
    p2 = np.array([[0.1, 0.9], [0.5, 0.5]])
    members = [evaluation.Predictions(p, evaluation.categorical_scores(p), np.array([0, 1]))
               for p in (p1, p2)]
    combined = ensemble.combine(members)
    np.testing.assert_allclose(combined.probs, [[0.5, 0.5], [0.5, 0.5]])
    h = lambda q: -np.sum(q * np.log(q), -1)  # noqa: E731
    expected_mi = h(np.array([0.5, 0.5])) - h(np.array([0.9, 0.1]))
    np.testing.assert_allclose(-combined.scores["neg_mi"], [expected_mi, 0.0], atol=1e-12)
    assert "um" not in combined.scores


@pytest.mark.parametrize("preset", sorted(config_lib.VARIANTS))
def test_each_method_default_is_written_once_in_its_dataclass(preset):
    """A preset names its method and only what differs from the method's dataclass defaults;
    no method setting is a config field of its own."""
    fields = config_lib.VARIANTS[preset]
    method = methods.METHODS[fields.get("method", "evidential")]
    defaults = method.settings()
    given = config_lib.json_object(config_lib.set_fields(
        config_lib.default_config("mnist"), method_args=fields.get("method_args", "")),
        "method_args")
    assert set(given) <= set(defaults)
    assert [k for k in given if given[k] == defaults[k]] == []
    assert not set(fields) & (set(defaults) | set(config_lib.LEGACY_METHOD_FIELDS))
    assert not set(config_lib.default_config("mnist")) & set(config_lib.LEGACY_METHOD_FIELDS)


def test_the_edl_familys_loss_spec_defaults_are_the_configs():
    """The EDL family's settings are the config's top-level fields (the paper's choices every
    preset names); `LossSpec`'s defaults, kept for the library's direct use, are the same."""
    from gedl_jax.evidential.loss import LossSpec
    from gedl_jax.methods.evidential import spec_from_config

    assert spec_from_config(config_lib.resolve(config_lib.default_config("mnist"))) == \
        LossSpec(num_classes=10)


def test_the_documented_diff_of_adding_duq_is_the_code():
    """docs/architecture.md ("Adding a baseline") shows what adding DUQ touches: its file (its
    line count as the diff's stat gives it), its import, one line of METHODS, one preset line;
    those lines are the code's, and no other module of the package names DUQ's class."""
    text = ARCHITECTURE.read_text()
    package = Path(methods.__file__).resolve().parents[1]
    lines = (package / "methods" / "duq.py").read_text().count("\n")
    assert f" gedl_jax/methods/duq.py      | {lines} +" in text
    table = (package / "methods" / "__init__.py").read_text()
    section = text.split("## Adding a baseline")[1].split("```diff")[1].split("```")[0]
    added_lines = re.findall(r"^\+(?!\+\+ )(.*)$", section, re.M)
    assert len(added_lines) == 3
    for added in added_lines:
        where = table if "methods" in added or "duq.DUQ" in added else (
            package / "config" / "presets.py").read_text()
        assert added in where, added
    assert methods.METHODS["duq"].settings() == {"length_scale": 0.1, "gamma": 0.999,
                                                  "gradient_penalty": 0.5}
