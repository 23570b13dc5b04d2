"""The optional experiment tracker (`config.tracker`): "none" (the default), or "mlflow", which
logs each run to MLflow as well; metrics.jsonl and TensorBoard are written either way.

- One MLflow run per workdir that holds a run: a seed's, and an ensemble's (its members nested
  under it); a `config.seeds` command's runs are nested under a run of the command's workdir
  (MLflow's `mlflow.parentRunId` tag).
- Params: the config's fields, as config.json holds them (a string as it is, anything else as
  JSON text). Metrics: every record of metrics.jsonl, as `<split>/<name>` (TensorBoard's tags)
  at the record's step and time, logged where the loop writes the record, without waiting for
  MLflow; the final evaluation's headline numbers as `eval/<name>` at the evaluated
  checkpoint's step. Artifacts: config.json, eval_results.json, eval_table.md and the plots.
- A later evaluation of a workdir (`gedl-evaluate --workdir`) is an MLflow run of its own,
  nested under the training run (`MlflowRun.open_evaluation`): what it chose as params, its
  headline numbers and its result files; MLflow missing there is a line, not an error.
- The run's id is kept in `<workdir>/mlflow_run.json`: a resumed run continues its MLflow run
  and first logs the records of metrics.jsonl that MLflow does not have (those of a run killed
  before they reached it, or trained with the tracker off), so the MLflow run holds every
  record of metrics.jsonl.
- Where: `config.tracker_uri`, else $MLFLOW_TRACKING_URI, else `./mlruns`, a local folder (no
  server); the experiment: `config.tracker_experiment`, else $MLFLOW_EXPERIMENT_NAME, else
  "gedl-jax". Process 0 alone logs. `mlflow` is imported only here, and only for "mlflow".
- An MLflow that cannot be reached or refuses the run when it starts is one `error:` line
  (exit 2) before the first step; a failure while the run trains or at its end is one line, and
  the run goes on (its records are in metrics.jsonl, which its next start logs).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import jax

from gedl_jax import files
from gedl_jax.run import preemption, rundir
from gedl_jax.run.heartbeat import log

__all__ = ["DEFAULT_EXPERIMENT", "DEFAULT_URI", "RUN_FILE", "CommandRun", "MlflowRun",
           "TrackerError", "check_available", "ending", "experiment_name", "metric_key",
           "param_text", "status_after", "tracking_uri"]

RUN_FILE = "mlflow_run.json"   # in the workdir: the MLflow run to continue
DEFAULT_URI = "./mlruns"
DEFAULT_EXPERIMENT = "gedl-jax"
INSTALL = "pip install 'gedl-jax[mlflow]'"
# MLflow's limits (mlflow.utils.validation): a param's length; params, metrics per log_batch.
PARAM_LENGTH, PARAMS_PER_BATCH, METRICS_PER_BATCH = 6000, 100, 1000
# Queued record batches waited for together (they are done long before: a bound on memory).
MAX_PENDING = 256


class TrackerError(ValueError):
    """The tracker cannot start: MLflow missing, unreachable or refusing the run (exit 2)."""


def enabled(config) -> bool:
    """Whether `config` asks for MLflow."""
    return str(config.get("tracker", "none")) == "mlflow"


def _mlflow():
    try:
        import mlflow
    except ImportError as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise TrackerError(f"config.tracker='mlflow' needs MLflow, which does not import "
                           f"({first}): {INSTALL}, or --config.tracker=none") from None
    return mlflow


def check_available(config) -> None:
    """Before anything is written: MLflow imports where `config.tracker` is "mlflow" (on every
    process, so that all of them stop together), else one line saying how to install it."""
    if enabled(config):
        _mlflow()


def tracking_uri(config) -> str:
    """Where the runs go: config.tracker_uri, $MLFLOW_TRACKING_URI or ./mlruns; a folder as an
    absolute path (a resumed run started from another folder finds the same store)."""
    uri = (str(config.get("tracker_uri", "")) or os.environ.get("MLFLOW_TRACKING_URI", "")
           or DEFAULT_URI)
    if _is_folder(uri) and not uri.startswith("file:"):
        return str(pathlib.Path(uri).expanduser().absolute())
    return uri


def experiment_name(config) -> str:
    """The MLflow experiment: config.tracker_experiment, $MLFLOW_EXPERIMENT_NAME or
    "gedl-jax"."""
    return (str(config.get("tracker_experiment", "")) or
            os.environ.get("MLFLOW_EXPERIMENT_NAME", "") or DEFAULT_EXPERIMENT)


def _is_folder(uri: str) -> bool:
    """A local folder store: a path or a file: URI (a one-letter scheme is a Windows drive)."""
    scheme = urllib.parse.urlparse(uri).scheme
    return scheme in ("", "file") or len(scheme) == 1


def param_text(value: Any) -> str:
    """A config value as an MLflow param: a string as it is, anything else as JSON text
    (config.json's form: `true`, `[0, 1]`), cut at MLflow's length."""
    return (value if isinstance(value, str) else json.dumps(value))[:PARAM_LENGTH]


def metric_key(split: str, name: str) -> str:
    """TensorBoard's tag `<split>/<name>`; a character MLflow refuses in a name (an OOD set
    named by its path, say) becomes "_"."""
    clean = re.sub(r"[^\w.\- :]", "_", name).replace("..", "__")
    return f"{split}/{clean}"


def status_after(error: BaseException | None) -> str:
    """The MLflow status of a run that ended with `error`: stopped (a signal, preemption) or
    failed."""
    if error is None:
        return "FINISHED"
    stopped = (KeyboardInterrupt, preemption.Preempted, preemption.EvaluationInterrupted)
    return "KILLED" if isinstance(error, stopped) else "FAILED"


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _client(uri: str):
    mlflow = _mlflow()
    if _is_folder(uri):
        # Recent MLflow releases (3.17 among them) open their folder store only for those who
        # ask for it; a folder needs no server and no SQL packages (mlflow-skinny), which is
        # why it is the default here.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return mlflow.MlflowClient(tracking_uri=uri)


class MlflowRun:
    """One workdir's MLflow run, on process 0: `open` it, `log_record` each record as the loop
    writes it, `log_results` the evaluation, `end` it."""

    def __init__(self, client, run_id: str, uri: str, metric_type):
        self.client, self.run_id, self.uri = client, run_id, uri
        self._metric = metric_type   # mlflow.entities.Metric
        self.pending: list[Any] = []   # queued record batches (RunOperations)
        self.ended = False
        self._warned = False

    @classmethod
    def open(cls, config, workdir: str | os.PathLike, parent=None) -> MlflowRun | None:
        """The MLflow run of `workdir` (None unless config.tracker is "mlflow", and on
        processes other than 0): the one `<workdir>/mlflow_run.json` names where it is in the
        same store, else a new one (nested under `parent`'s run: an `MlflowRun` or a
        `CommandRun`, or None). Logs the params
        (the config's fields, as config.json holds them) and the records of metrics.jsonl it
        lacks."""
        if not enabled(config) or jax.process_index() != 0:
            return None
        workdir = pathlib.Path(workdir)
        uri = tracking_uri(config)
        parent_id = parent.run_id if parent is not None else None
        files.refuse_link(workdir / RUN_FILE, "MLflow run id (read back to resume)")
        try:
            client = _client(uri)
            from mlflow.entities import Metric

            run_id, resumed = _existing_run(client, workdir, uri), True
            if run_id is None:
                run_id, resumed = _new_run(client, experiment_name(config), workdir,
                                           parent_id), False
            else:
                client.update_run(run_id, "RUNNING")
            files.write_text(workdir / RUN_FILE, json.dumps(
                {"run_id": run_id, "tracking_uri": uri}, indent=2) + "\n")
            run = cls(client, run_id, uri, Metric)
            run._log_params(rundir.config_fields(config))
            logged = run._log_missing_records(workdir / "metrics.jsonl")
        except TrackerError:
            raise
        except Exception as e:  # noqa: BLE001 (MLflow's stores and REST client raise many kinds)
            raise TrackerError(f"MLflow at {uri} did not take the run of {workdir}: "
                               f"{_one_line(e)} (--config.tracker_uri chooses the store; "
                               f"--config.tracker=none turns the tracker off)") from e
        more = f", {logged} earlier record(s) of metrics.jsonl added" if logged else ""
        log(f"MLflow: run {run_id} ({'continued' if resumed else 'new'}) in {uri}{more}")
        return run

    @classmethod
    def open_evaluation(cls, config, workdir: str | os.PathLike,
                        results_dir: str | os.PathLike, params: dict[str, Any]
                        ) -> MlflowRun | None:
        """A later evaluation of `workdir` (`gedl-evaluate --workdir`) as an MLflow run of its
        own, nested under the workdir's training run where `<workdir>/mlflow_run.json` names one
        (in that run's store), else in `tracking_uri(config)`; None unless config.tracker is
        "mlflow", and on processes other than 0. `params`: what this evaluation chose (its
        extra OOD sets, the results folder, the fields it changed). Nothing is written into the
        workdir, and the results are files whatever MLflow does: MLflow missing or refusing
        the run is one line, and the evaluation goes on (None)."""
        if not enabled(config) or jax.process_index() != 0:
            return None
        workdir, results_dir = pathlib.Path(workdir), pathlib.Path(results_dir)
        uri, parent = tracking_uri(config), None
        try:
            recorded = json.loads((workdir / RUN_FILE).read_text())
            uri, parent = str(recorded["tracking_uri"]), str(recorded["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            pass   # trained with the tracker off: the evaluation's run stands alone
        try:
            client = _client(uri)
            from mlflow.entities import Metric, Param

            if parent is not None and _existing_run(client, workdir, uri) is None:
                parent = None   # the training run was deleted from the store
            run_id = _new_run(client, experiment_name(config), workdir, parent,
                              run_name=f"evaluate {results_dir.absolute().name}",
                              tags={"gedl.results_dir": str(results_dir.absolute())})
            client.log_batch(run_id, params=[Param(k, param_text(v))
                                             for k, v in sorted(params.items())])
        except Exception as e:  # noqa: BLE001 (MLflow's stores and REST client raise many kinds)
            why = (f"MLflow does not import ({INSTALL})" if isinstance(e, TrackerError)
                   else f"MLflow at {uri}: {_one_line(e)}")
            log(f"{why}: this evaluation of {workdir} is not logged to MLflow; its results are "
                f"the files in {results_dir}")
            return None
        nested = f", nested under the training run {parent}" if parent else ""
        log(f"MLflow: evaluation run {run_id} in {uri}{nested}")
        return cls(client, run_id, uri, Metric)

    def _log_params(self, params: dict[str, Any]) -> None:
        """The params MLflow does not have: all of a new run's; those added since for a
        resumed one (MLflow keeps a param's first value: a resume-safe field changed on resume
        is in the config.json artifact)."""
        from mlflow.entities import Param

        have = self.client.get_run(self.run_id).data.params
        new = [Param(k, param_text(v)) for k, v in sorted(params.items()) if k not in have]
        for i in range(0, len(new), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[i:i + PARAMS_PER_BATCH])

    def _log_missing_records(self, path: pathlib.Path) -> int:
        """The scalars of metrics.jsonl's records newer than the newest MLflow has under their
        key (all of them for a new run); returns how many records gave some."""
        if not path.exists():
            return 0
        newest = {key: max(m.timestamp for m in self.client.get_metric_history(self.run_id, key))
                  for key in self.client.get_run(self.run_id).data.metrics}
        missing, records = [], 0
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:   # a line cut short by a kill
                continue
            metrics = [m for m in self._metrics(record) if m.timestamp > newest.get(m.key, -1)]
            records += bool(metrics)
            missing.extend(metrics)
        for i in range(0, len(missing), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=missing[i:i + METRICS_PER_BATCH])
        return records

    def _metrics(self, record: dict[str, Any]) -> list[Any]:
        """A metrics.jsonl record ({"step", "split", "time", **scalars}) as MLflow metrics."""
        stamp, step, split = int(record["time"] * 1000), int(record["step"]), record["split"]
        return [self._metric(metric_key(split, k), float(v), stamp, step)
                for k, v in record.items() if k not in ("step", "split", "time")
                and isinstance(v, (int, float)) and not isinstance(v, bool)]

    def log_record(self, record: dict[str, Any]) -> None:
        """A record as the loop writes it to metrics.jsonl, queued (MLflow's own thread sends
        it): the loop never waits for MLflow."""
        if self.ended:
            return
        if len(self.pending) >= MAX_PENDING:
            self.flush()
        metrics = self._metrics(record)
        if not metrics:
            return
        try:
            self.pending.append(self.client.log_batch(self.run_id, metrics=metrics,
                                                      synchronous=False))
        except Exception as e:  # noqa: BLE001
            self._warn(e)

    def flush(self) -> None:
        """Wait for the queued records; a failure is one line (metrics.jsonl has them)."""
        pending, self.pending = self.pending, []
        for operation in pending:
            try:
                operation.wait()
            except Exception as e:  # noqa: BLE001
                self._warn(e)

    def log_results(self, metrics: dict[str, float], step: int,
                    paths: list[str | os.PathLike]) -> None:
        """The final evaluation: its headline numbers as `eval/<name>` at `step`, and the
        files of `paths` that exist as artifacts."""
        try:
            stamp = int(time.time() * 1000)
            if metrics:
                self.client.log_batch(self.run_id, metrics=[
                    self._metric(metric_key("eval", k), float(v), stamp, int(step))
                    for k, v in metrics.items()])
            for path in paths:
                if pathlib.Path(path).is_file():
                    self.client.log_artifact(self.run_id, str(path))
        except Exception as e:  # noqa: BLE001
            self._warn(e)

    def end(self, status: str = "FINISHED") -> None:
        """Wait for the queued records and mark the run `status` (once)."""
        if self.ended:
            return
        self.flush()
        self.ended = True
        try:
            self.client.set_terminated(self.run_id, status)
        except Exception as e:  # noqa: BLE001
            self._warn(e)

    def _warn(self, error: BaseException) -> None:
        if not self._warned:
            self._warned = True
            log(f"MLflow run {self.run_id} in {self.uri}: {_one_line(error)}; metrics.jsonl and "
                f"TensorBoard have every record, and the run's next start logs what MLflow "
                f"lacks")


def _existing_run(client, workdir: pathlib.Path, uri: str) -> str | None:
    """The id `<workdir>/mlflow_run.json` records, if it is a run (not deleted) of the store at
    `uri`."""
    try:
        recorded = json.loads((workdir / RUN_FILE).read_text())
        run_id = str(recorded["run_id"])
        if recorded.get("tracking_uri") != uri:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        run = client.get_run(run_id)
    except Exception:  # noqa: BLE001 (MLflow raises its own exception for an unknown id)
        return None
    return run_id if run.info.lifecycle_stage == "active" else None


def _new_run(client, name: str, workdir: pathlib.Path, parent: str | None,
             run_name: str | None = None, tags: dict[str, str] | None = None) -> str:
    experiment = client.get_experiment_by_name(name)
    experiment_id = (experiment.experiment_id if experiment is not None
                     else client.create_experiment(name))
    tags = {"gedl.workdir": str(workdir.absolute()), **(tags or {})}
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    return client.create_run(experiment_id, run_name=run_name or workdir.absolute().name,
                             tags=tags).info.run_id


class CommandRun:
    """The MLflow run of a command's workdir (a `config.seeds` command's) that its runs nest
    under, opened when the first of them opens: input that fails before any run starts leaves
    neither a folder nor an MLflow run behind."""

    def __init__(self, config, workdir: str | os.PathLike):
        self.config, self.workdir = config, pathlib.Path(workdir)
        self.run: MlflowRun | None = None

    @property
    def run_id(self) -> str | None:
        if self.run is None:
            self.run = MlflowRun.open(self.config, self.workdir)
        return None if self.run is None else self.run.run_id

    def log_results(self, metrics: dict[str, float], step: int,
                    paths: list[str | os.PathLike]) -> None:
        """`MlflowRun.log_results`, once the run is open (nothing before)."""
        if self.run is not None:
            self.run.log_results(metrics, step, paths)

    def end(self, status: str = "FINISHED") -> None:
        """`MlflowRun.end`, once the run is open (nothing before)."""
        if self.run is not None:
            self.run.end(status)


@contextlib.contextmanager
def ending(run: MlflowRun | CommandRun | None) -> Iterator[MlflowRun | CommandRun | None]:
    """`run` (if any) ended with the block: FINISHED, or as `status_after` the block's error."""
    try:
        yield run
    except BaseException as e:
        if run is not None:
            run.end(status_after(e))
        raise
    if run is not None:
        run.end()
