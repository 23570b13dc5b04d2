"""The floors of the package: the one table of which layer of gedl_jax stands on which floor.
tests/test_layout.py reads it (every import between layers goes down to a lower floor), and this
module draws it into the "Layers" section of docs/architecture.md, so that the document and the
rule cannot drift (a test compares the committed document with `document`'s output).

    python -m tools.architecture            # rewrite the section of docs/architecture.md
    python -m tools.architecture --check    # exit 1 when the committed section is not the table's
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys
import textwrap
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCUMENT = REPO / "docs" / "architecture.md"
BEGIN = "<!-- tools/architecture.py: begin -->"
END = "<!-- tools/architecture.py: end -->"


@dataclasses.dataclass(frozen=True)
class Layer:
    label: str                   # the layer as the drawing names it: "run/", "files.py"
    modules: tuple[str, ...]     # the modules it holds, each with its submodules
    text: tuple[str, ...]        # what it holds: a summary, then a paragraph per part


# The floors, the top one first. A layer imports only layers on the floors below its own (never
# one beside it); a module belongs to the layer with the longest of its names that prefixes the
# module's name.
FLOORS: tuple[tuple[Layer, ...], ...] = (
    (Layer("commands/", ("gedl_jax.commands",), (
        "the command lines, one module per command: train, evaluate, fetch, regenerate, report "
        "(bin/report.py), compare (bin/compare_runs.py), pretrained; flags -> calls into the "
        "floors below (no loop, no logic). cli.py: what every command line (absl or argparse) "
        "shares: one-line errors, exit statuses, --debug. Nothing below imports this floor: "
        "`python -m gedl_jax.train` and the other documented names forward here from their "
        "`if __name__ == \"__main__\":` block (or a package's __main__.py), which holds that "
        "forward and nothing else",)),),
    (Layer("pretrained/", ("gedl_jax.pretrained",), (
        "registered pretrained models: fileformat.py (one msgpack file: variables, method "
        "state, config, committed results), registry.py (name -> file, sha256, provenance; "
        "shipped or fetched by the data downloader), model.py (load, predict, evaluate through "
        "run/workdir.py), export.py (a run's best checkpoint -> a file)",)),
     Layer("train.py, evaluate.py", ("gedl_jax.train", "gedl_jax.evaluate"), (
         "the engine's entry points for code (notebooks, scripts): train.train, "
         "train_and_evaluate[_vmapped], train_ensemble, each holding its workdir; "
         "evaluate.evaluate_workdir, predict_outputs, restore_run, corruption_study (the "
         "run/ floor's, by the names notebooks use)",)),
     Layer("notebook.py", ("gedl_jax.notebook",), (
         "what the notebooks share: their smoke setting, the check that jax uses the GPU",)),
     Layer("configuration.py", ("gedl_jax.configuration",), (
         "the old name of the configuration, kept for one release with a DeprecationWarning: "
         "gedl_jax.config's names, configs.build_config and the moved helpers; nothing of "
         "gedl_jax imports it",)),),
    (Layer("run/", ("gedl_jax.run",), (
        "the run engine",
        "experiment.py: a run's setup, once for training and evaluation: inputs obtained, "
        "official splits + the seeded train/validation split, OOD sets, normalisation, the "
        "method (base rate from the training labels)",
        "training.py: the loop and the engine's entries: train, train_and_evaluate[_vmapped], "
        "train_ensemble (each sets the process up, resolves the config once and holds the "
        "workdir)",
        "programs.py: SeedProgram: one seed or S vmapped seeds behind one object",
        "step_benchmark.py: that program on synthetic data, compiled ahead of time (what "
        "bin/benchmark.py and the speed studies time)",
        "steps.py: TrainState, the shard_map train step, the predict step",
        "sharding.py: the \"data\" mesh, replicated / batch placement (the only one)",
        "optimizer.py: Adam + cosine, L2 or decoupled weight decay",
        "checkpointing.py: Orbax `last` + `best`; restores pre-interface checkpoints",
        "rundir.py, progress.py, preemption.py, distributed.py: the workdir, metrics log, "
        "non-finite stop, SIGTERM -> checkpoint + exit 75, multi-host start-up",
        "lock.py, heartbeat.py: one writer per workdir (an flock on "
        "<workdir>/.gedl_jax.lock); a line for each wait over 3 s (data loading, XLA compiles)",
        "tracking.py: config.tracker=\"mlflow\": the run's MLflow run beside metrics.jsonl "
        "(params, records, results; continued on resume; mlflow imported only for it)",
        "workdir.py: restore a run, predict (test, validation, OOD), evaluate, write results, "
        "tables, predictions.npz, plots",
        "evaluating.py: evaluate_workdir: a trained workdir (or ensemble) evaluated into its "
        "results folder, held meanwhile, and logged to the tracker",
        "ensemble.py, corruption_study.py, inference.py: members -> one model; CIFAR-10-C "
        "study; a method's predictor over a whole split (pad, mask, gather)")),
     Layer("configs/", ("gedl_jax.configs",), (
         "the preset config files (the only copy; the repository's top-level configs/ is this "
         "folder, so `--config=configs/<name>.py` names them from a clone), `build_config` (the "
         "presets with the methods' own `source` recipes: what the config files call) and "
         "`--config=<name>` resolution, from any directory",)),),
    (Layer("methods/", ("gedl_jax.methods",), (
        "one file per method: its math, its `Method` (its settings and their defaults, its "
        "`build`)",
        "base.py, common.py: the interface (below), MethodSetup; shared helpers, the config -> "
        "network builders (a user network: checked per method, and `UserBackbone` gives the "
        "feature methods its `features`)",
        "__init__.py: METHODS: config.method -> its class (one line a method)",
        "evidential.py: GEDL, EDL, I-EDL, R-EDL, RED, the ablation rows (math: evidential/)",
        "softmax.py: softmax classifier, MC Dropout",
        "laplace.py: softmax classifier + last-layer Laplace posterior (fitted after training)",
        "own_loop.py: `EvidentialObjective`: the EDL family's loss for your own training loop",
        "duq.py, prior_networks.py (KL-PN, RKL-PN), postnet.py, daedl.py, fedl.py: the "
        "baselines; docs/baselines.md their readings and choices")),),
    # config/, data/, evaluation/ and networks/ import nothing of each other: the config
    # knows no method (the methods hand it their recipes and settings), the scoring is
    # pure NumPy, the data know no model.
    (Layer("config/", ("gedl_jax.config",), (
        "the experiment configuration around one schema: fields.py (every field once: default, "
        "type, allowed values, doc, group, list-ness, resume-safety; the EDL family's defaults "
        "are evidential.loss.LossSpec's, the allowed values of what the math dispatches on are "
        "its tables' keys), schema.py (its views and the help), presets.py (the datasets' "
        "protocol settings, VARIANTS, the modifiers), values.py, checks.py, resolution.py "
        "(`resolve`, `ResolvedConfig`: the one config type the floors above read), legacy.py",)),
     Layer("data/", ("gedl_jax.data",), (
        "registry + checksums, data folder, verified download, readers, TFDS, cache, loading, "
        "splits, device-side batching/augmentation, CIFAR-10-C regenerator; npz.py / "
        "image_folder.py / own.py: your data by name (\"npz:<path>\", \"tfds:<name>\", "
        "\"images:<folder>\")",)),
     Layer("evaluation/", ("gedl_jax.evaluation",), (
         "pure scoring of arrays (NumPy float64): checks.py (every input check, once), "
         "metrics.py, scores.py, core.py (Predictions -> all numbers), aggregation.py (mean ± "
         "std over seeds), report.py (results_table, what bin/report.py prints) and tables/ "
         "(one module per table section, in the order of its SECTIONS list), plots.py; "
         "selective.py, conformal.py, calibration.py, ood_aupr.py, posthoc.py (post-hoc OOD "
         "scores), smooth_ece.py, laplace.py (last-layer Laplace in closed form), bootstrap.py "
         "(intervals over resampled examples; paired for two runs: compare.py, whose command "
         "line is bin/compare_runs.py), sections.py (the sections beyond the paper), saved.py "
         "(predictions.npz), any_model.py (`evaluate_model`: any predict function, run in "
         "padded jitted batches). Of data/ it reads only the registry (near / far OOD groups); "
         "imports by name count too (the layout test)",)),
     Layer("networks/", ("gedl_jax.networks",), (
         "one definition of each network: protocol.py (ConvNet, VGG16 as one `Backbone`, "
         "logits or features), layers.py (conv / pool / inits), resnet.py, mlp.py, user.py "
         "(any Linen / NNX class by name, checked)",)),),
    (Layer("evidential/", ("gedl_jax.evidential",), (
        "the Dirichlet math, pure JAX (no Flax, no I/O): activations, prior (a, W; Eq. "
        "e2alpha / weight_update), dirichlet (KL, Fisher), special (digamma / trigamma "
        "series), loss_terms (likelihoods, regularisers), schedules (EDL annealing, GEDL tau), "
        "uncertainty measures, loss (the EDL family's loss from a LossSpec, Table "
        "unified_edl)",)),
     Layer("data/registry.py, data/errors.py",
           ("gedl_jax.data.registry", "gedl_jax.data.errors"), (
         "each dataset's facts, in one place (K, validation fraction, OOD sets, near / far "
         "groups) and the data's error type: they import nothing else of gedl_jax, so "
         "config/ and evaluation/ may read them",)),
     Layer("files.py", ("gedl_jax.files",), (
         "files written whole (a temporary file under a random name, created with "
         "O_EXCL|O_NOFOLLOW, then renamed), files written in place refused where a link was "
         "planted; which errors are a full disk or memory that ran out",)),
     Layer("paper.py", ("gedl_jax.paper",), (
         "the paper's table numbers and the methods of its tables",)),),
)
# The most floors the package may stand on (the longest chain of imports between layers).
MAX_FLOORS = 7


def floor_number(index: int) -> int:
    """The floor of FLOORS[index], counted from the bottom one (1)."""
    return len(FLOORS) - index


def layers() -> list[tuple[int, Layer]]:
    """(floor, layer) of every layer, the top floor first."""
    return [(floor_number(i), layer) for i, floor in enumerate(FLOORS) for layer in floor]


def layer_of(module: str) -> tuple[int, Layer] | None:
    """(floor, layer) of the gedl_jax module `module` (the layer with the longest of its module
    names that is `module` or a package above it); None for the package `gedl_jax` itself and
    for a module no layer holds."""
    best, length = None, -1
    for floor, layer in layers():
        for name in layer.modules:
            if (module == name or module.startswith(name + ".")) and len(name) > length:
                best, length = (floor, layer), len(name)
    return best


LABEL_WIDTH, TEXT_WIDTH = 26, 66


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, never broken inside a `code span`."""
    unbroken = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
    return [line.replace("\0", " ") for line in
            textwrap.wrap(unbroken, width, break_on_hyphens=False, break_long_words=False)]


def _wrapped(text: Sequence[str]) -> list[str]:
    """A layer's text in lines: its summary, then each part with its later lines indented."""
    lines = []
    for i, paragraph in enumerate(text):
        wrapped = _wrap(paragraph, TEXT_WIDTH - (2 if i else 0))
        lines += [("  " if i and j else "") + line for j, line in enumerate(wrapped)]
    return lines


def drawing() -> str:
    """The floors as the document draws them, the top one first: the floor's number beside its
    first layer, each layer's label and what it holds; a blank line between floors."""
    lines: list[str] = []
    blank = " " * 7
    for index, floor in enumerate(FLOORS):
        if lines:
            lines.append("")
        for position, layer in enumerate(floor):
            number = f"{floor_number(index):>3}    " if position == 0 else blank
            label = layer.label
            if len(label) >= LABEL_WIDTH:   # a long label on a line of its own
                lines.append(number + label)
                number, label = blank, ""
            for j, text in enumerate(_wrapped(layer.text)):
                lines.append((number if j == 0 else blank)
                             + f"{label if j == 0 else '':<{LABEL_WIDTH}}{text}".rstrip())
    return "\n".join(lines)


def section() -> str:
    """What docs/architecture.md holds between its markers."""
    intro = (f"The package stands on {len(FLOORS)} floors (at most {MAX_FLOORS}), the longest "
             f"chain of imports between its layers. Each layer imports only from layers on the "
             f"floors below its own, so there is no import cycle in `gedl_jax`; a test builds "
             f"the import graph, with function-level imports and imports by name, and checks "
             f"these rules. This drawing is the table of tools/architecture.py, written by "
             f"`python -m tools.architecture`; a test keeps the two equal.")
    return "\n".join([BEGIN, *_wrap(intro, 100), "", "```", "floor  layer", drawing(),
                      "```", END])


def document(current: str) -> str:
    """`current` (docs/architecture.md's text) with the section between the markers drawn from
    the table."""
    if current.count(BEGIN) != 1 or current.count(END) != 1:
        raise ValueError(f"{DOCUMENT} must hold the markers {BEGIN} and {END} once each")
    head, rest = current.split(BEGIN)
    _, tail = rest.split(END)
    return head + section() + tail


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.architecture", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the committed section is not the "
                             "table's drawing")
    args = parser.parse_args(argv)
    current = DOCUMENT.read_text()
    wanted = document(current)
    if args.check:
        if wanted != current:
            print(f"{DOCUMENT.relative_to(REPO)} is not the table's drawing: run python -m "
                  f"tools.architecture", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        from gedl_jax import files

        files.write_text(DOCUMENT, wanted)
        print(f"wrote {DOCUMENT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
