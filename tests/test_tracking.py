"""The optional tracker (`config.tracker="mlflow"`, gedl_jax/run/tracking.py): tiny runs into a
temporary MLflow store, read back with MLflow's own client and compared with what the run wrote
itself (metrics.jsonl, config.json, eval_results.json and its files); a resumed run continues
its MLflow run; without MLflow installed, one `error:` line and exit 2 before anything is
written.

The runs train on the generated MNIST files (tests/conftest.py), as tests/test_train.py does.
"""

import json
import pathlib
import sys
from collections import defaultdict

import pytest

from gedl_jax import config as config_lib
from gedl_jax import configs
from gedl_jax.commands import cli
from gedl_jax.run import tracking, training

# 256 training examples in batches of 32: 8 steps an epoch, a record every 4 steps
TINY = {"train_examples": 256, "val_examples": 64, "batch_size": 32, "num_epochs": 2,
        "log_every_steps": 4, "eval_batch_size": 64, "evaluate_at_end": False, "plots": False,
        "ood_datasets": (), "checkpoint_interval_seconds": 0, "posthoc_scores": "none"}


@pytest.fixture(scope="module")
def data_dir(generated_data_files):
    with generated_data_files.registered() as root:
        yield root


@pytest.fixture(autouse=True)
def _fast(fast_compile, monkeypatch):
    # the store's folder is named by each test; nothing from the environment decides it
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    # what MLflow 3.7+ asks of whoever reads a folder store (the run sets it for itself:
    # `test_a_run_opens_a_folder_store_by_itself`); restored after each test
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def tiny_config(data_dir, store, **overrides):
    c = configs.build_config("mnist", "gedl")
    fields = {**TINY, "data_dir": str(data_dir), "tracker": "mlflow",
              "tracker_uri": str(store), **overrides}
    for k, v in fields.items():
        config_lib.set_fields(c, **{k: v})
    return c


def need_mlflow():
    """The tests that read a store skip without MLflow (the dev extra installs it)."""
    return pytest.importorskip("mlflow", reason="MLflow is the `mlflow` extra (and in dev)")


def client(store):
    """MLflow's own client of the store."""
    return need_mlflow().MlflowClient(tracking_uri=str(store))


def run_id_of(workdir: pathlib.Path) -> str:
    return json.loads((workdir / tracking.RUN_FILE).read_text())["run_id"]


def jsonl_series(workdir: pathlib.Path) -> dict[str, list[tuple[int, float, int]]]:
    """metrics.jsonl as {"<split>/<name>": sorted [(step, value, time in ms)]}."""
    series = defaultdict(list)
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for name, value in record.items():
            if name not in ("step", "split", "time"):
                series[f"{record['split']}/{name}"].append(
                    (record["step"], value, int(record["time"] * 1000)))
    return {k: sorted(v) for k, v in series.items()}


def mlflow_series(mlflow_client, run_id: str, prefix_not: str = "eval/"
                  ) -> dict[str, list[tuple[int, float, int]]]:
    keys = [k for k in mlflow_client.get_run(run_id).data.metrics if not k.startswith(prefix_not)]
    return {k: sorted((m.step, m.value, m.timestamp)
                      for m in mlflow_client.get_metric_history(run_id, k)) for k in keys}


def assert_params_are_the_config(mlflow_client, run_id: str, workdir: pathlib.Path):
    config_json = json.loads((workdir / "config.json").read_text())
    params = mlflow_client.get_run(run_id).data.params
    assert set(params) == set(config_json)
    for name, value in config_json.items():
        assert (params[name] if isinstance(value, str) else json.loads(params[name])) == value, \
            name


def test_seeds_log_params_metrics_and_results_each_in_their_run_nested_in_the_command(
        data_dir, tmp_path):
    """Two seeds trained together (vmap): each seed's MLflow run holds its config.json as params,
    every record of its metrics.jsonl (key, step, value and time), its evaluation's headline
    numbers at the evaluated checkpoint's step and its result files, byte for byte; both are
    nested in the command's run, which holds the seeds' table."""
    store, workdir = tmp_path / "mlruns", tmp_path / "run"
    mlflow_client = client(store)
    c = tiny_config(data_dir, store, seeds="0,1", vmap_seeds=True, evaluate_at_end=True,
                    plots=True, checkpoint_interval_seconds=60)   # checkpoints at the end only
    results = training.train(c, workdir)
    parent = run_id_of(workdir)
    assert mlflow_client.get_run(parent).info.status == "FINISHED"
    assert [a.path for a in mlflow_client.list_artifacts(parent)] == ["eval_table.md"]
    children = mlflow_client.search_runs(
        [mlflow_client.get_run(parent).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(r.info.run_id for r in children) == sorted(
        run_id_of(workdir / f"seed_{s}") for s in (0, 1))
    for summary in results:
        seed_dir = pathlib.Path(summary["workdir"])
        run_id = run_id_of(seed_dir)
        run = mlflow_client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent
        assert run.data.tags["gedl.workdir"] == str(seed_dir.absolute())
        assert_params_are_the_config(mlflow_client, run_id, seed_dir)
        series = jsonl_series(seed_dir)
        assert {"train/loss", "validation/accuracy"} <= set(series)
        assert mlflow_series(mlflow_client, run_id) == series
        # the final evaluation's headline numbers, at the step of the evaluated checkpoint
        evaluation = json.loads((seed_dir / "eval_results.json").read_text())
        expected = {"accuracy": evaluation["id"]["accuracy"], "nll": evaluation["id"]["nll"],
                    "brier": evaluation["id"]["brier"], "ece": evaluation["id"]["ece"],
                    "conf_mp": evaluation["id"]["misclassification"]["mp"]["aupr"]}
        for name, value in expected.items():
            (logged,) = mlflow_client.get_metric_history(run_id, f"eval/{name}")
            assert (logged.value, logged.step) == (value, summary["best_step"]), name
        # the result files, as the run wrote them
        artifacts = {a.path for a in mlflow_client.list_artifacts(run_id)}
        plots = {pathlib.Path(p).name for p in evaluation["plots"]}
        assert "reliability_diagram.png" in plots
        assert artifacts == {"config.json", "eval_results.json", "eval_table.md"} | plots
        local = pathlib.Path(mlflow_client.download_artifacts(run_id, "", str(tmp_path / run_id)))
        for name in artifacts:
            assert (local / name).read_bytes() == (seed_dir / name).read_bytes(), name
        # the default writers as ever
        assert list((seed_dir / "tensorboard").iterdir())


def test_a_resumed_run_continues_its_mlflow_run_and_holds_every_record(data_dir, tmp_path):
    """Started without the tracker, stopped at step 4; resumed with it, stopped at step 12; then
    resumed to the end: one MLflow run (its id kept in the workdir), whose metrics are every
    record of metrics.jsonl, those written before it existed and those written again after a
    resume from the checkpoint of step 8 included."""
    need_mlflow()
    store, workdir = tmp_path / "mlruns", tmp_path / "run"
    training.train_and_evaluate(tiny_config(data_dir, store, tracker="none"), workdir,
                                stop_after_steps=4)
    assert not (workdir / tracking.RUN_FILE).exists() and not store.exists()
    training.train_and_evaluate(tiny_config(data_dir, store), workdir, stop_after_steps=12)
    run_id = run_id_of(workdir)
    mlflow_client = client(store)
    assert mlflow_client.get_run(run_id).info.status == "KILLED"
    assert mlflow_series(mlflow_client, run_id) == jsonl_series(workdir)
    training.train_and_evaluate(tiny_config(data_dir, store), workdir)
    assert run_id_of(workdir) == run_id
    assert mlflow_client.get_run(run_id).info.status == "FINISHED"
    series = jsonl_series(workdir)
    assert [step for step, _, _ in series["train/loss"]] == [4, 4, 8, 12, 12, 16]
    assert mlflow_series(mlflow_client, run_id) == series
    assert_params_are_the_config(mlflow_client, run_id, workdir)


def test_tracker_mlflow_without_mlflow_is_one_error_line_and_exit_2(data_dir, tmp_path,
                                                                     monkeypatch, capsys):
    """As where the extra is not installed: `import mlflow` fails. The run stops before it
    writes anything, with one line saying how to install it."""
    monkeypatch.setitem(sys.modules, "mlflow", None)   # `import mlflow` raises ImportError
    workdir = tmp_path / "run"
    c = tiny_config(data_dir, tmp_path / "mlruns")
    assert cli.guarded(lambda: training.train(c, workdir), debug=False) == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config.tracker='mlflow' needs MLflow")
    assert "pip install 'gedl-jax[mlflow]'" in lines[0]
    assert not workdir.exists() and not (tmp_path / "mlruns").exists()
    # the default needs nothing of it
    tracking.check_available(tiny_config(data_dir, tmp_path / "mlruns", tracker="none"))


def test_a_run_opens_a_folder_store_by_itself(tmp_path, monkeypatch):
    """Nothing set in the environment: the run goes to ./mlruns, in the experiment "gedl-jax",
    with its params; `end` marks it finished."""
    mlflow_client = client(tmp_path / "mlruns")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")   # (the fixture's value comes back after)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    c = config_lib.default_config("mnist")
    config_lib.set_fields(c, tracker="mlflow")
    run = tracking.MlflowRun.open(c, "run")
    assert run_id_of(tmp_path / "run") == run.run_id
    assert json.loads((tmp_path / "run" / tracking.RUN_FILE).read_text())["tracking_uri"] == \
        str(tmp_path / "mlruns")
    logged = mlflow_client.get_run(run.run_id)
    assert logged.info.status == "RUNNING"
    assert mlflow_client.get_experiment(logged.info.experiment_id).name == "gedl-jax"
    assert logged.data.params["learning_rate"] == "0.001"
    run.end()
    assert mlflow_client.get_run(run.run_id).info.status == "FINISHED"


def test_where_the_runs_go(tmp_path, monkeypatch):
    """config.tracker_uri, else $MLFLOW_TRACKING_URI, else ./mlruns; a folder made absolute (a
    resume from another folder finds the same store); a URL as it is."""
    monkeypatch.chdir(tmp_path)
    c = config_lib.default_config("mnist")
    assert tracking.tracking_uri(c) == str(tmp_path / "mlruns")
    assert tracking.experiment_name(c) == "gedl-jax"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "mine")
    assert tracking.tracking_uri(c) == "http://127.0.0.1:5000"
    assert tracking.experiment_name(c) == "mine"
    config_lib.set_fields(c, tracker_uri="store", tracker_experiment="paper")
    assert tracking.tracking_uri(c) == str(tmp_path / "store")
    assert tracking.experiment_name(c) == "paper"
    config_lib.set_fields(c, tracker_uri="sqlite:///runs.db")
    assert tracking.tracking_uri(c) == "sqlite:///runs.db"


def test_names_and_values_mlflow_takes():
    """A record's key is TensorBoard's tag, with what MLflow refuses in a name made "_" (an OOD
    set named by its path); a param is the value as config.json holds it."""
    assert tracking.metric_key("train", "loss") == "train/loss"
    assert tracking.metric_key("epoch_eval", "npz:../far.npz_mp") == "epoch_eval/npz:___far.npz_mp"
    assert tracking.metric_key("epoch_eval", "images:/a/b~c_um") == "epoch_eval/images:_a_b_c_um"
    assert [tracking.param_text(v) for v in ("K", True, 0.001, (0, 1), "")] == \
        ["K", "true", "0.001", "[0, 1]", ""]


def test_only_process_0_logs(tmp_path, monkeypatch):
    import jax

    monkeypatch.setattr(jax, "process_index", lambda: 1)
    c = config_lib.default_config("mnist")
    config_lib.set_fields(c, tracker="mlflow", tracker_uri=str(tmp_path / "mlruns"))
    assert tracking.MlflowRun.open(c, tmp_path / "run") is None
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("error, status", [(None, "FINISHED"), (KeyboardInterrupt(), "KILLED"),
                                           (RuntimeError("x"), "FAILED")])
def test_the_status_a_run_ends_with(error, status):
    assert tracking.status_after(error) == status


def test_a_later_evaluation_is_an_mlflow_run_nested_under_the_training_run(data_dir, tmp_path,
                                                                           monkeypatch,
                                                                           capsys):
    """`gedl-evaluate --workdir` of a run trained with the tracker: an MLflow run of its own,
    nested under the training run, with what the evaluation chose as params, its headline
    numbers at the restored checkpoint's step and its result files, byte for byte; the
    workdir's run file is left as it was. Without MLflow the evaluation still writes its
    results, and says in a line that it is not logged."""
    need_mlflow()
    from gedl_jax import evaluate

    store, workdir, out = tmp_path / "mlruns", tmp_path / "run", tmp_path / "out"
    training.train_and_evaluate(tiny_config(data_dir, store), workdir)
    run_file = (workdir / tracking.RUN_FILE).read_bytes()
    trained_id = run_id_of(workdir)
    results = evaluate.evaluate_workdir(workdir, results_dir=out,
                                        overrides={"bootstrap_samples": 0})
    assert (workdir / tracking.RUN_FILE).read_bytes() == run_file
    mlflow_client = client(store)
    experiment = mlflow_client.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT)
    runs = {r.info.run_id: r for r in mlflow_client.search_runs([experiment.experiment_id])}
    assert set(runs) - {trained_id} and len(runs) == 2
    (evaluation,) = [r for r in runs.values() if r.info.run_id != trained_id]
    assert evaluation.data.tags["mlflow.parentRunId"] == trained_id
    assert evaluation.info.run_name == "evaluate out" and evaluation.info.status == "FINISHED"
    params = evaluation.data.params
    assert params["results_dir"] == str(out.absolute()) and params["extra_ood"] == "[]"
    assert params["override.bootstrap_samples"] == "0"
    (accuracy,) = mlflow_client.get_metric_history(evaluation.info.run_id, "eval/accuracy")
    assert accuracy.value == results["id"]["accuracy"]
    steps = [s for s, _, _ in jsonl_series(workdir)["train/loss"]]
    assert 0 < accuracy.step <= max(steps)
    local = mlflow_client.download_artifacts(evaluation.info.run_id, "eval_results.json",
                                             str(tmp_path))
    assert pathlib.Path(local).read_bytes() == (out / "eval_results.json").read_bytes()
    capsys.readouterr()
    # without MLflow: the results, and one line
    monkeypatch.setitem(sys.modules, "mlflow", None)
    again = evaluate.evaluate_workdir(workdir, results_dir=tmp_path / "out2",
                                      overrides={"bootstrap_samples": 0})
    assert again["id"]["accuracy"] == results["id"]["accuracy"]
    said = capsys.readouterr().out
    assert "MLflow does not import" in said and "not logged to MLflow" in said
    assert (tmp_path / "out2" / "eval_results.json").is_file()
