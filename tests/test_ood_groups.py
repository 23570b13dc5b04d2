"""Evaluating the user's own OOD sets: near/far groups (`config.ood_groups`, `evaluate
--ood_groups`: "GROUP=SET") parsed, checked against the sets a run evaluates before any work,
merged over the registry's groups and averaged into `ood_groups.<group>` like the registered
sets (the means recomputed here from the per-set results); their labels in the tables; and
`evaluate --image_resize`. Generated data only."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from training_fixtures import REPO, TINY_FIELDS, subprocess_env, write_tiny_mnist

from gedl_jax import config as config_lib
from gedl_jax import configs, data, evaluate, train
from gedl_jax.run import workdir as workdir_lib
from compile_mode import fast_compilation


def test_group_entries_parse_and_malformed_ones_are_refused():
    assert data.parse_ood_groups(("far = images:/a=b", "near=npz:c.npz")) == {
        "images:/a=b": "far", "npz:c.npz": "near"}   # split at the first "=" only
    assert data.parse_ood_groups(("far=x", "far=x")) == {"x": "far"}
    for bad in ("far", "middle=x", "far=", "=x", "Far=x"):
        with pytest.raises(ValueError, match="expected GROUP=SET"):
            data.parse_ood_groups((bad,))
    with pytest.raises(ValueError, match="declared both 'near' and 'far'"):
        data.parse_ood_groups(("near=x", "far=x"))


def test_a_declared_group_wins_over_the_registrys():
    assert data.ood_group("mnist", "fashion_mnist") == "near"
    assert data.ood_group("mnist", "fashion_mnist", {"fashion_mnist": "far"}) == "far"
    assert data.ood_group("mnist", "npz:x.npz") is None
    assert data.ood_group("mnist", "npz:x.npz", {"npz:x.npz": "near"}) == "near"
    assert data.ood_group("mnist", "kmnist", {"npz:x.npz": "near"}) == "near"


def _config(**fields):
    c = configs.build_config("mnist", "gedl")
    config_lib.set_fields(c, **fields)
    return c


def test_the_config_checks_its_groups_before_any_work():
    c = _config(ood_datasets="kmnist,npz:a.npz", ood_groups="far=npz:a.npz,far=kmnist")
    assert c.ood_groups == ("far=npz:a.npz", "far=kmnist")   # the command line's comma list
    config_lib.validate(c)
    assert data.check_ood_groups(c.ood_groups, c.ood_datasets) == {"npz:a.npz": "far",
                                                                    "kmnist": "far"}
    with pytest.raises(ValueError, match=r"'npz:b.npz', not among the OOD sets evaluated "
                                         r"\('kmnist', 'npz:a.npz'\)"):
        data.check_ood_groups(_config(ood_groups="far=npz:b.npz").ood_groups,
                              ("kmnist", "npz:a.npz"))
    with pytest.raises(ValueError, match="config.ood_groups: OOD group 'outer=kmnist'"):
        config_lib.validate(_config(ood_datasets="kmnist", ood_groups="outer=kmnist"))
    with pytest.raises(ValueError, match="lists far=kmnist twice"):
        config_lib.validate(_config(ood_datasets="kmnist",
                                              ood_groups="far=kmnist,far=kmnist"))
    assert "ood_groups" in config_lib.RESUME_SAFE_FIELDS   # evaluation only


def test_evaluate_adds_its_groups_to_the_runs_own():
    saved = dict(_config(ood_datasets="kmnist,npz:a.npz",
                         ood_groups="far=npz:a.npz,near=kmnist").to_dict())
    merged = workdir_lib.config_from_saved(saved, {"ood_groups": ("near=npz:a.npz",
                                                                  "far=npz:b.npz")})
    assert data.parse_ood_groups(merged.ood_groups) == {
        "kmnist": "near", "npz:a.npz": "near", "npz:b.npz": "far"}


def test_a_training_run_refuses_a_group_for_a_set_it_does_not_evaluate_before_any_step(
        tmp_path):
    c = _config(**{**TINY_FIELDS, "data_dir": str(write_tiny_mnist(tmp_path / "data")),
                   "cache_dir": str(tmp_path / "cache"), "ood_groups": "far=npz:b.npz"})
    with pytest.raises(ValueError, match="'npz:b.npz', not among the OOD sets evaluated"):
        train.train_and_evaluate(c, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def _ood_file(path, seed, high):
    rng = np.random.default_rng(seed)
    np.savez(path, test_images=rng.integers(0, high, (24, 28, 28, 1), dtype=np.uint8))
    return f"npz:{path}"


@pytest.fixture(scope="module")
def run_with_groups(tmp_path_factory):
    """A tiny MNIST run with three OOD sets of its own (noise of three brightnesses, so their
    detection metrics differ), one of them declared far, evaluated at its end."""
    root = tmp_path_factory.mktemp("groups")
    sets = [_ood_file(root / f"{n}.npz", seed, high)
            for n, seed, high in (("a", 1, 256), ("b", 2, 8), ("c", 3, 64))]
    with fast_compilation():
        c = _config(**{**TINY_FIELDS, "num_epochs": 1, "evaluate_at_end": True,
                       "data_dir": str(write_tiny_mnist(root / "data")),
                       "cache_dir": str(root / "cache"), "ood_datasets": ",".join(sets),
                       "ood_groups": f"far={sets[0]}"})
        train.train_and_evaluate(c, root / "w")
    return root, sets, json.loads((root / "w" / "eval_results.json").read_text())


def _assert_group_means(results, group, sets):
    section = results["ood_groups"][group]
    assert section["sets"] == sets
    for score, metrics in section["detection"].items():
        for metric, mean in metrics.items():
            per_set = [results["ood"][s]["detection"][score][metric] for s in sets]
            assert mean == pytest.approx(float(np.mean(per_set)), rel=1e-12, abs=1e-15)


def test_a_declared_set_is_averaged_into_its_group_and_evaluate_can_regroup(run_with_groups):
    root, (a, b, c), results = run_with_groups
    _assert_group_means(results, "far", [a])
    assert "near" not in results["ood_groups"]
    assert results["evaluation_options"]["ood_groups"] == {a: "far"}
    # evaluate's groups join the run's: far = a (the run's) and b, near = c
    again = evaluate.evaluate_workdir(root / "w", overrides={"ood_groups": (f"far={b}",
                                                                           f"near={c}")},
                                      results_dir=root / "regrouped")
    _assert_group_means(again, "far", [a, b])
    _assert_group_means(again, "near", [c])
    far = [again["ood"][s]["detection"]["um"]["auroc"] for s in (a, b)]
    assert far[0] != far[1]   # a mean of different values: a wrong set would show
    for s in (a, b, c):   # the same predictions: only the grouping changed
        assert again["ood"][s] == results["ood"][s]
    # a set given to this evaluation only (evaluate --extra_ood) joins a group as well
    extra = _ood_file(root / "d.npz", 4, 128)
    more = evaluate.evaluate_workdir(root / "w", extra_ood=(extra,),
                                     overrides={"ood_groups": (f"near={extra}",)},
                                     results_dir=root / "extra")
    _assert_group_means(more, "near", [extra])
    _assert_group_means(more, "far", [a])


def test_evaluate_refuses_a_group_for_a_set_it_does_not_evaluate_before_any_work(
        run_with_groups, tmp_path):
    root, (a, _, _), _ = run_with_groups
    for flag, message in [(f"--ood_groups=far={a}x", f"'{a}x', not among the OOD sets evaluated"),
                          ("--ood_groups=faraway=kmnist", "expected GROUP=SET")]:
        proc = subprocess.run([sys.executable, "-m", "gedl_jax.evaluate",
                               f"--workdir={root / 'w'}", flag, f"--out={tmp_path}/out"],
                              cwd=REPO, env=subprocess_env(tmp_path / "cli_cache"),
                              capture_output=True, text=True, timeout=120)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr
        assert not (tmp_path / "out").exists() and "evaluated" not in proc.stdout


def test_tables_show_a_path_named_set_by_its_last_part_and_name_it_in_full_once(
        run_with_groups):
    from gedl_jax.evaluation import report
    from gedl_jax.evaluation.tables import context

    _, (a, b, c), results = run_with_groups
    text = report.results_table([results])
    assert f"mnist→{a}" not in text and "| mnist→npz:a.npz MP |" in text
    assert "| gedl | npz:b.npz | MP |" in text   # the detection details' set column
    assert f"npz:a.npz = {a}; npz:b.npz = {b}; npz:c.npz = {c}." in text
    assert "unweighted mean over the sets of each group (far: npz:a.npz)" in text
    latex = report.results_table([results], fmt="latex")
    tabulars = latex.split(r"\begin{tabular}")[1:]
    assert tabulars and all(context.latex_escape(a) not in t.split(r"\end{tabular}")[0]
                            for t in tabulars)
    assert r"mnist$\rightarrow$npz:a.npz" in latex
    # two sets whose paths end alike keep their full names: a label names one set
    assert report.set_labels(["images:/x/set/", "images:/y/set", "images:/z/other"]) == {
        "images:/x/set/": "images:/x/set/", "images:/y/set": "images:/y/set",
        "images:/z/other": "images:other"}
    assert report.set_labels(["tfds:cifar10_corrupted/snow_1", "npz:rel/x.npz", "/data/idx"]
                             ) == {"tfds:cifar10_corrupted/snow_1": "tfds:cifar10_corrupted/snow_1",
                                   "npz:rel/x.npz": "npz:rel/x.npz", "/data/idx": "idx"}


def test_the_command_line_gives_the_entries_with_their_equals_signs(tmp_path):
    parse = ("import sys\nfrom absl import flags\nfrom gedl_jax import configs\n"
             "from gedl_jax import config as config_lib\n"
             "configs.define_config_flag('config')\n"
             "flags.FLAGS(['prog', '--config=mnist:gedl', *sys.argv[1:]])\n"
             "print(repr(config_lib.normalize_lists(flags.FLAGS.config).ood_groups))\n")
    proc = subprocess.run([sys.executable, "-c", parse,
                           "--config.ood_groups=far=images:/d/tex tures,near=npz:a=b.npz"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=subprocess_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == repr(("far=images:/d/tex tures",
                                                         "near=npz:a=b.npz"))


def test_evaluate_image_resize_chooses_how_an_image_folder_set_is_sized(run_with_groups,
                                                                         tmp_path):
    """`evaluate --image_resize` (over the run's config.image_resize): the predictions of an
    images:<folder> set of wide colour images are those of the folder loaded with that mode."""
    from PIL import Image

    from gedl_jax import evaluation

    root = run_with_groups[0]
    rng = np.random.default_rng(5)
    (tmp_path / "wide").mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (20, 44, 3), dtype=np.uint8)).save(
            tmp_path / "wide" / f"{i}.png")
    name = f"images:{tmp_path / 'wide'}"
    run = workdir_lib.restore_run(root / "w")
    # the run's config says crop; the flag asks for stretch
    assert run.experiment.config.image_resize == "crop"
    proc = subprocess.run([sys.executable, "-m", "gedl_jax.evaluate", f"--workdir={root / 'w'}",
                           f"--extra_ood={name}", "--image_resize=stretch",
                           f"--out={tmp_path / 'out'}"],
                          cwd=REPO, env=subprocess_env(tmp_path / "cli_cache"),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    written = evaluation.load_predictions(tmp_path / "out" / "predictions.npz")[f"ood/{name}"]
    probs = {mode: workdir_lib.predict(run, data.load_own_ood(
        name, like=(28, 28, 1), image_resize=mode, cache_dir=tmp_path / "cache"),
        with_labels=False).probs for mode in ("crop", "stretch")}
    np.testing.assert_array_equal(written.probs, probs["stretch"])
    assert not np.array_equal(probs["crop"], probs["stretch"])
