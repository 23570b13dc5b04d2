"""bin/reproduce.py: each run records the environment that trained it, and a table made later
from reused runs names those environments, not only the machine that wrote the table."""
import json
import pathlib
import shutil
import subprocess
import sys


from training_fixtures import (
    TINY_FIELDS,
    needs_committed_results,
    subprocess_env,
    write_tiny_mnist,
)

REPO = pathlib.Path(__file__).resolve().parents[1]

ENV_GPU = {"commit": "abc1234", "dirty": False, "device": "NVIDIA H100 80GB HBM3",
           "device_count": 1, "cpu_count": 16, "machine": "x86_64", "python": "3.12.3",
           "jax": "0.11.2", "flax": "0.12.10", "optax": "0.2.8"}
ENV_CPU = dict(ENV_GPU, device="cpu", cpu_count=2, commit="def5678", dirty=True)


def _reproduce():
    from bin import reproduce

    return reproduce


def test_each_run_keeps_its_environment_and_the_table_lists_them(tmp_path):
    reproduce = _reproduce()
    dirs = [tmp_path / "runs" / "gedl" / f"seed_{s}" for s in range(4)]
    for d in dirs[:3]:
        d.mkdir(parents=True)
    reproduce.record_environment(dirs[0], ENV_GPU)
    reproduce.record_environment(dirs[1], ENV_GPU)
    reproduce.record_environment(dirs[2], ENV_CPU)
    reproduce.record_environment(dirs[2], ENV_GPU)       # an existing record is never replaced
    reproduce.record_environment(dirs[3], ENV_GPU)       # no run there: nothing is created
    assert json.loads((dirs[2] / "environment.json").read_text()) == ENV_CPU
    assert not dirs[3].exists()

    lines = reproduce.trained_on(dirs)
    assert lines == [
        "NVIDIA H100 80GB HBM3 x1, 16 CPU cores (x86_64); Python 3.12.3, jax 0.11.2, "
        "flax 0.12.10, optax 0.2.8; commit abc1234 (2 runs)",
        "cpu x1, 2 CPU cores (x86_64); Python 3.12.3, jax 0.11.2, flax 0.12.10, optax 0.2.8; "
        "commit def5678 (uncommitted changes) (1 run)",
        "not recorded (runs trained before environment.json existed) (1 run)",
    ]


def test_a_run_resumed_on_another_machine_names_both(tmp_path):
    """Recorded when the run starts; a different machine that resumes it is appended (once per
    change of machine), and the table names the first machine and each one that resumed it."""
    reproduce = _reproduce()
    run = tmp_path / "runs" / "gedl" / "seed_0"
    run.mkdir(parents=True)
    reproduce.record_environment(run, ENV_GPU, continuing=True)    # started on the GPU
    reproduce.record_environment(run, ENV_GPU, continuing=True)    # resumed there: no entry
    reproduce.record_environment(run, ENV_CPU, continuing=True)    # preempted, resumed on a CPU
    reproduce.record_environment(run, ENV_CPU, continuing=True)
    recorded = json.loads((run / "environment.json").read_text())
    assert recorded["resumed_on"] == [ENV_CPU]
    assert {k: v for k, v in recorded.items() if k != "resumed_on"} == ENV_GPU
    assert reproduce.trained_on([run]) == [
        "NVIDIA H100 80GB HBM3 x1, 16 CPU cores (x86_64); Python 3.12.3, jax 0.11.2, "
        "flax 0.12.10, optax 0.2.8; commit abc1234; resumed on cpu x1, 2 CPU cores (x86_64); "
        "Python 3.12.3, jax 0.11.2, flax 0.12.10, optax 0.2.8; commit def5678 (uncommitted "
        "changes) (1 run)"]


def test_a_run_under_way_without_a_record_is_recorded_as_resumed(tmp_path):
    """A run started by code that wrote no environment.json (its checkpoints exist) is recorded
    at its resume with the step it resumes from, and the table says the record starts there."""
    reproduce = _reproduce()
    run = tmp_path / "runs" / "duq" / "seed_0"
    for step in (3750, 4125):
        (run / "checkpoints" / "last" / str(step)).mkdir(parents=True)
    (run / "checkpoints" / "last" / "tmp_4500.orbax-checkpoint-tmp").mkdir()
    reproduce.record_environment(run, ENV_CPU, continuing=True)
    recorded = json.loads((run / "environment.json").read_text())
    assert recorded == {**ENV_CPU, "recorded_at_resume_from_step": 4125}
    assert reproduce.trained_on([run]) == [
        "cpu x1, 2 CPU cores (x86_64); Python 3.12.3, jax 0.11.2, flax 0.12.10, optax 0.2.8; "
        "commit def5678 (uncommitted changes) (recorded when resuming from step 4125: what "
        "trained the steps before it is not recorded) (1 run)"]
    # Resumed again on the same machine: nothing is added, and a record that older code gave a
    # "resumed_on" entry for the same machine (its first record's extra field made them differ)
    # is read as one machine by the table and by bin/export_pretrained.py.
    reproduce.record_environment(run, ENV_CPU, continuing=True)
    assert json.loads((run / "environment.json").read_text()) == recorded
    older = {**recorded, "resumed_on": [ENV_CPU]}
    (run / "environment.json").write_text(json.dumps(older))
    assert reproduce.trained_on([run])[0].endswith("is not recorded) (1 run)")
    reproduce.record_environment(run, ENV_CPU, continuing=True)
    assert json.loads((run / "environment.json").read_text()) == older
    from bin import export_pretrained

    assert export_pretrained.environment_fields(run)["hardware"] == "cpu x1, 2 CPU cores (x86_64)"
    reproduce.record_environment(run, ENV_GPU, continuing=True)
    assert reproduce.trained_on([run])[0].endswith(
        "is not recorded); resumed on NVIDIA H100 80GB HBM3 x1, 16 CPU cores (x86_64); Python "
        "3.12.3, jax 0.11.2, flax 0.12.10, optax 0.2.8; commit abc1234 (1 run)")
    assert export_pretrained.environment_fields(run)["hardware"] == (
        "cpu x1, 2 CPU cores (x86_64); resumed on NVIDIA H100 80GB HBM3 x1 (jax 0.11.2, commit "
        "abc1234)")
    fresh = tmp_path / "runs" / "duq" / "seed_1"
    fresh.mkdir()
    reproduce.record_environment(fresh, ENV_CPU, continuing=True)
    assert json.loads((fresh / "environment.json").read_text()) == ENV_CPU


def test_a_seed_at_chance_level_is_named_under_the_table():
    reproduce = _reproduce()
    def result(seed, accuracy):
        return {"seed": seed, "id": {"accuracy": accuracy, "num_classes": 10}}
    grouped = {"gedl": [result(0, 0.994), result(1, 0.1173), result(2, 0.15)],
               "edl": [result(0, 0.151)]}
    lines = reproduce.runs_at_chance(grouped)
    assert len(lines) == 2
    assert lines[0].startswith("gedl seed 1: test accuracy 11.73 % (chance: 10.0 %)")
    assert lines[1].startswith("gedl seed 2: test accuracy 15.00 %")


COMMITTED = REPO / "docs" / "results" / "mnist_long"


def _committed_runs_in_study_layout(out, variants):
    """The committed long-table runs (docs/results/mnist_long/runs/<v>_seed<s>/) laid out as
    bin/reproduce.py trains them (runs/<v>/seed_<s>/)."""
    for v in variants:
        for s in range(3):
            (out / "runs" / v / f"seed_{s}").mkdir(parents=True)
            for f in ("eval_results.json", "environment.json"):
                shutil.copy(COMMITTED / "runs" / f"{v}_seed{s}" / f, out / "runs" / v / f"seed_{s}")


def _rows(text, variants):
    return {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()
            if line.startswith("| ") and line.split(" | ")[0].lstrip("| ") in variants}


@needs_committed_results
def test_aggregate_only_remakes_the_committed_rows_without_training(tmp_path, capsys):
    """--aggregate_only trains nothing (no checkpoint, no run folder touched) and its rows are
    the committed long table's, digit for digit, from the committed per-run results."""
    variants = ["kl_pn", "rkl_pn"]
    out = tmp_path / "study"
    _committed_runs_in_study_layout(out, variants)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    reproduce = _reproduce()
    assert reproduce.main(["--study=main", "--setting=long", f"--variants={','.join(variants)}",
                           "--seeds=0,1,2", "--aggregate_only", f"--out={out}"]) == 0
    after = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert sorted(set(after) - set(before)) == [pathlib.Path(f"results.{x}")
                                                for x in ("json", "md", "tex")]
    made = _rows((out / "results.md").read_text(), variants)
    committed = _rows((COMMITTED / "results.md").read_text(), variants)
    assert set(made) == set(variants)
    assert made == committed
    assert "Runs trained on: cpu x1, 2 CPU cores" in (out / "results.md").read_text()


@needs_committed_results
def test_aggregate_only_names_the_unfinished_runs_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    _committed_runs_in_study_layout(out, ["kl_pn"])
    (out / "runs" / "kl_pn" / "seed_2" / "eval_results.json").unlink()
    reproduce = _reproduce()
    assert reproduce.main(["--study=main", "--setting=long", "--variants=kl_pn,duq",
                           "--seeds=0,1,2", "--aggregate_only", f"--out={out}"]) == 2
    err = capsys.readouterr().err
    assert "kl_pn/seed_2" in err and "duq/seed_0" in err and "kl_pn/seed_0" not in err
    assert "without --aggregate_only" in err
    assert not (out / "results.md").exists() and not (out / "runs" / "duq").exists()
    assert reproduce.main(["--study=main", "--aggregate_only", f"--out={tmp_path / 'none'}"]) == 2
    assert not (tmp_path / "none").exists()


def test_the_runs_of_a_study_train_under_the_determinism_flags(tmp_path):
    """The study's runs train in its own process, after `environment()` has started jax's
    backend: the flags are set before that (its results say they were in force), with no
    determinism flag in the caller's XLA_FLAGS."""
    data_dir = write_tiny_mnist(tmp_path / "data")
    env = subprocess_env(tmp_path / "cache")
    env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split()
                                if "deterministic" not in f and "autotune" not in f)
    fields = dict(TINY_FIELDS, num_epochs=1, allow_chance=True, evaluate_at_end=True)
    out = tmp_path / "study"
    proc = subprocess.run([sys.executable, "bin/reproduce.py", "--study=main", "--setting=short",
                           "--variants=softmax", "--seeds=0", f"--data_dir={data_dir}",
                           *(f"--override={k}={v}" for k, v in fields.items()),
                           f"--out={out}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "runs" / "softmax" / "seed_0" / "eval_results.json").read_text())
    assert results["numerics"]["deterministic_flags_in_force"] is True


# ---------------------------------------------------------------- one row into a results folder
CIFAR = REPO / "docs" / "results" / "cifar10_paper"


def test_seeds_take_ranges_and_bad_seeds_are_one_error(capsys):
    reproduce = _reproduce()
    assert reproduce.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert reproduce.parse_seeds("0,3-5, 9") == [0, 3, 4, 5, 9]
    assert reproduce.main(["--seeds=0-x", "--out=/nonexistent/x"]) == 2
    assert "'0-x' is not an integer or a range" in capsys.readouterr().err


def test_cifar_runs_evaluate_the_ood_sets_the_data_folder_holds_and_name_the_rest(
        generated_data, capsys):
    """`--ood_datasets=auto` on CIFAR-10: the paper's sets (SVHN, CIFAR-100) and the far-OOD sets
    derived from MNIST and Fashion-MNIST, of which the generated data folder (the MNIST family
    only) holds the derived ones; the others are named with the way to get them."""
    reproduce = _reproduce()
    args = reproduce._parser().parse_args(["--dataset=cifar10", "--setting=paper",
                                           "--variants=gedl,edl", "--out=x"])
    _, configs = reproduce.plan(args)
    assert [tuple(c.ood_datasets) for _, c in configs] == [("mnist_rgb32",
                                                            "fashion_mnist_rgb32")] * 2
    assert args.ood_left_out == ["svhn_cropped", "cifar100"]
    lines = reproduce.ood_lines(configs, args.ood_left_out)
    assert lines[0] == "OOD sets: mnist_rgb32, fashion_mnist_rgb32"
    assert "left out, not in the data folder or the cache: svhn_cropped, cifar100" in lines[1]
    assert "python -m gedl_jax.data.fetch svhn_cropped cifar100" in lines[2]
    assert all(len(line) < 200 for line in lines)
    # an explicit choice wins, and MNIST keeps its preset's sets
    for extra, want in ((["--ood_datasets=preset"], ("svhn_cropped", "cifar100")),
                        (["--override=ood_datasets=mnist_rgb32"], ("mnist_rgb32",)),
                        (["--ood_datasets=fashion_mnist_rgb32"], ("fashion_mnist_rgb32",))):
        args = reproduce._parser().parse_args(["--dataset=cifar10", "--variants=gedl",
                                               "--out=x", *extra])
        assert tuple(reproduce.plan(args)[1][0][1].ood_datasets) == want
    args = reproduce._parser().parse_args(["--variants=gedl", "--out=x"])
    assert tuple(reproduce.plan(args)[1][0][1].ood_datasets) == ("kmnist", "fashion_mnist")


@needs_committed_results
def test_a_row_published_into_a_results_folder_remakes_its_table(tmp_path, capsys):
    """`--results`: the committed CIFAR-10 runs, published from a study's layout by
    --aggregate_only, give the committed results.md byte for byte; a second row's command adds
    its row and its machine, and keeps the first's."""
    reproduce = _reproduce()
    out = tmp_path / "study"
    for row in ("gedl", "edl"):
        shutil.copytree(CIFAR / "runs" / f"{row}_seed0", out / "runs" / row / "seed_0")
    results = tmp_path / "results"
    assert reproduce.main(["--dataset=cifar10", "--setting=paper", "--variants=gedl", "--seeds=0",
                           "--aggregate_only", f"--out={out}", f"--results={results}"]) == 0
    text = (results / "results.md").read_text()
    assert "| gedl (1 seed) | 89.95 |" in text and "| edl (1 seed)" not in text
    for file in reproduce.PUBLISHED_FILES:   # byte for byte: no machine path of ours in them
        assert (results / "runs" / "gedl_seed0" / file).read_bytes() == \
            (CIFAR / "runs" / "gedl_seed0" / file).read_bytes()
    assert reproduce.main(["--dataset=cifar10", "--setting=paper", "--variants=edl", "--seeds=0",
                           "--aggregate_only", f"--out={out}", f"--results={results}"]) == 0
    assert (results / "results.md").read_text() == (CIFAR / "results.md").read_text()
    rows = json.loads((results / "rows.json").read_text())
    # the machine's paths as RUNS_DIR (the folder holding --out), as in the published files
    assert rows["gedl"][0]["published_by"].endswith("--out=RUNS_DIR/study "
                                                    "--results=RUNS_DIR/results")
    assert "NVIDIA H200 x1" in text
