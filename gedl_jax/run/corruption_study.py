"""The paper's Fig. uncertainty (bottom row) on CIFAR-10-C: uncertainty against severity.

For each corruption, the mean of u = W/S, mutual information and variance sum of a Dirichlet
method at severities 0 (the clean test set) to 5, averaged over the runs given, and, for a deep
ensemble (`config.ensemble_size`, `train.train_ensemble`), the ensemble's epistemic uncertainty:
the mutual information between its prediction and the member. An ensemble's Dirichlet measures
are averaged over its members. (Earlier versions read "the ensemble" as the seeds passed in;
train an ensemble instead: `configs/cifar10.py:gedl,ensemble`.)
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from gedl_jax import data, files
from gedl_jax.data.registry import corruption_file_stem
from gedl_jax.evaluation import core
from gedl_jax.run import ensemble, workdir

__all__ = ["corruption_study", "study_table"]


def _subset(split: data.Split, num_examples: int) -> data.Split:
    """`num_examples` evenly spaced examples (a split sorted by label still gives every class)."""
    from gedl_jax.data import corruptions as corruptions_lib

    if not num_examples or num_examples >= len(split):
        return split
    return split.take(corruptions_lib.subset_indices(len(split), num_examples), split.name)


def _source_label(sources: set[str], config, corruption: str) -> tuple[str, dict[str, Any]]:
    """A label naming where the corrupted sets came from, and the regenerated set's provenance
    (empty for the official release)."""
    if sources == {"regenerated"}:
        from gedl_jax.data import corruptions as corruptions_lib

        folder = corruptions_lib.regenerated_folder(
            data.resolve_data_dir(config.data_dir or None))
        stem = corruption_file_stem(corruption)
        entry = corruptions_lib.read_provenance(folder).get("corruptions", {}).get(stem, {})
        return corruptions_lib.describe_source(folder, corruption), dict(entry, folder=str(
            folder))
    if "regenerated" in sources:
        return "mixed official and regenerated CIFAR-10-C", {}
    return "official CIFAR-10-C", {}


def study_table(study: dict[str, Any]) -> str:
    """The corruption study (`corruption_study`'s result) as a markdown table: per corruption
    and severity, accuracy and the uncertainty means, with the data source named."""
    labels = sorted({v["source_label"] for v in study.values()})
    lines = [f"CIFAR-10-C corruption study; data: {'; '.join(labels)}. Severity 0 = clean test "
             "set; means over the examples, averaged over the runs.", "",
             "| corruption | severity | n | accuracy | u = W/S | mutual information | "
             "variance sum | ensemble MI | source |",
             "|---|---|---|---|---|---|---|---|---|"]
    for corruption, v in study.items():
        for sev, m in v["measures"].items():
            ens = v["ensemble_epistemic"]
            ens_text = f"{ens[sev]:.4f}" if ens else "-"
            lines.append(f"| {corruption} | {sev} | {v['num_examples'][sev]} | "
                         f"{v['accuracy'][sev]:.4f} | {m['u']:.4f} | "
                         f"{m['mutual_information']:.4f} | {m['variance_sum']:.5f} | "
                         f"{ens_text} | {v['source_label'] if sev else 'clean test'} |")
    return "\n".join(lines)


def _restore_study_runs(workdirs, overrides) -> list[tuple[list[workdir.RestoredRun], bool]]:
    """Each workdir as (its runs, is an ensemble): an ensemble's members, or the run itself."""
    restored = []
    for w in workdirs:
        config = workdir.saved_config(w, overrides)
        if config.ensemble_size:
            members = ensemble.restore_members(ensemble.member_dirs(w, config), overrides)
            restored.append((members, True))
        else:
            restored.append(([workdir.restore_run(w, overrides)], False))
    for runs, _ in restored:
        if "um" not in runs[0].experiment.method.score_names:   # no Dirichlet precision
            raise ValueError(f"the corruption study reads a Dirichlet (u = W/S, its mutual "
                             f"information and variance sum), which {runs[0].config.variant} "
                             f"does not predict: give runs of an evidential method\n"
                             f"  ({runs[0].experiment.method.describe()}; an ensemble of "
                             f"evidential runs adds the ensemble's mutual information)")
    return restored


def _severity_sets(run: workdir.RestoredRun, corruption: str, num_examples: int,
                   sources: set[str]) -> dict[int, data.Split]:
    config = run.config
    sets = {0: _subset(run.experiment.data.test, num_examples)}
    for severity in range(1, 6):
        split = data.load_corrupted(corruption, severity, data_dir=config.data_dir or None,
                                    cache_dir=config.cache_dir or None,
                                    source=config.data_source,
                                    tfds_data_dir=config.tfds_data_dir or None)
        sources.add(split.source.split("+")[0])
        sets[severity] = _subset(split, num_examples)
    return sets


def _predict(run: workdir.RestoredRun, split: data.Split, num_examples: int) -> core.Predictions:
    batch = run.config.eval_batch_size
    if num_examples:  # no padding a small study up to a whole large batch
        batch = min(batch, -(-num_examples // run.mesh.size) * run.mesh.size)
    return workdir.predict(run, split, batch_size=batch)


def _one_corruption(restored, corruption: str, num_examples: int) -> dict[str, Any]:
    """Measures, ensemble MI, accuracy and counts per severity for one corruption."""
    per_run, ensemble_mi, accuracy, counts, sources = [], [], {}, {}, set()
    for runs, is_ensemble in restored:
        sets = _severity_sets(runs[0], corruption, num_examples, sources)
        counts = {sev: len(split) for sev, split in sets.items()}
        preds = [{sev: _predict(run, split, num_examples) for sev, split in sets.items()}
                 for run in runs]
        for member in preds:
            per_run.append({sev: core.summarise_measures(core.ModelOutputs(p.alpha,
                                                                           p.prior_strength))
                            for sev, p in member.items()})
        for sev in sets:
            combined = ensemble.combine([member[sev] for member in preds])
            accuracy.setdefault(sev, []).append(float(np.mean(
                np.argmax(combined.probs, -1) == combined.labels)))
        if is_ensemble:
            ensemble_mi.append({sev: float(np.mean(-ensemble.combine(
                [member[sev] for member in preds]).scores["neg_mi"])) for sev in sets})
    measures = {sev: {m: float(np.mean([r[sev][m] for r in per_run])) for m in per_run[0][sev]}
                for sev in per_run[0]}
    mi = ({sev: float(np.mean([e[sev] for e in ensemble_mi])) for sev in ensemble_mi[0]}
          if ensemble_mi else None)
    return {"measures": measures, "ensemble_epistemic": mi,
            "accuracy": {sev: float(np.mean(a)) for sev, a in accuracy.items()},
            "num_examples": counts, "sources": sources}


def corruption_study(workdirs, corruptions, out_dir, overrides: dict[str, Any] | None = None,
                     num_examples: int = 0) -> dict[str, Any]:
    """For each corruption, the mean of u = W/S, mutual information and variance sum at
    severities 0 (clean test) to 5, averaged over the runs (an ensemble's members count as its
    runs), and the epistemic uncertainty of each deep ensemble among `workdirs` (the mutual
    information between prediction and member; None when no workdir is an ensemble).
    `num_examples` > 0 scores only n evenly spaced examples of the clean test set and of each
    severity (the same positions in each).

    Writes corruption_study.json, corruption_study.md and one PNG per corruption into `out_dir`;
    each names where the corrupted sets came from (the official release, or the set
    regenerated by gedl_jax.data.regenerate, with its seed and whether it is approximate)."""
    from gedl_jax.evaluation import plots  # matplotlib only when plotting

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    restored = _restore_study_runs(workdirs, overrides)
    num_runs = sum(len(runs) for runs, _ in restored)
    study: dict[str, Any] = {}
    for corruption in corruptions:
        entry = _one_corruption(restored, corruption, num_examples)
        sources = entry.pop("sources")
        label, provenance = _source_label(sources, restored[0][0][0].config, corruption)
        plot = plots.corruption_severity_study(
            entry["measures"], out_dir / f"corruption_{corruption}.png",
            ensemble_epistemic=entry["ensemble_epistemic"],
            title=f"{corruption}\n({label}, n={entry['num_examples'][1]})")
        study[corruption] = {**entry, "num_runs": num_runs,
                             "source": sorted(sources)[0] if len(sources) == 1 else
                             sorted(sources), "source_label": label,
                             "regenerated_provenance": provenance or None, "plot": str(plot)}
    files.write_text(out_dir / "corruption_study.json", json.dumps(study, indent=2))
    files.write_text(out_dir / "corruption_study.md", study_table(study) + "\n")
    return study
