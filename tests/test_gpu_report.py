"""tools/gpu_report.py: the README of a tools/gpu_check.sh folder says what its files hold.

A hand-made folder: pytest's log cut by a time limit (verbose and quiet forms), a benchmark with
the ConvNet step, and a training loop's metrics records whose times give a known rate, so every
number the report prints is known in advance.
"""

import json
import tempfile

from tools import gpu_report as report




def _folder(tmp_path, tests_log: str):
    (tmp_path / "environment.json").write_text(json.dumps(
        {"device": "NVIDIA Test", "commit": "abc1234", "jax": "0.x", "flax": "0.y",
         "python": "3.z", "cpu_count": 16}))
    (tmp_path / "wall_times.json").write_text(json.dumps(
        {"tests": {"seconds": 90, "exit_status": 124}, "train": {"seconds": 30,
                                                               "exit_status": 0}}))
    (tmp_path / "tests.log").write_text(tests_log)
    (tmp_path / "benchmark.json").write_text(json.dumps({"results": [
        {"model": "convnet", "dtype": "float32", "batch": 128, "seeds": 1,
         "precision": "default", "images_per_s": 100_000.0, "step_ms": 2.0}]}))
    # 1,000 steps in 2.5 s after the first record: 1.25x the floor of 1,000 x 2 ms
    records = [{"step": 100 * i, "split": "train", "time": 10.0 + 0.25 * (i - 1)}
               for i in range(1, 12)]
    (tmp_path / "train_metrics.jsonl").write_text(
        "\n".join(json.dumps(r) for r in records) + "\n")
    (tmp_path / "train_config.json").write_text(json.dumps({"num_epochs": 200}))
    return tmp_path


def test_a_cut_verbose_log_names_its_failures_and_the_loop_is_set_against_its_floor(tmp_path):
    folder = _folder(tmp_path, "[gw0] [ 1%] PASSED tests/test_a.py::one \n"
                               "[gw1] [ 2%] FAILED tests/test_b.py::two \n"
                               "[gw0] [ 3%] SKIPPED tests/test_a.py::three \n")
    assert report.main([str(folder)]) == 0
    text = (folder / "README.md").read_text()
    assert "so far 1 passed, 1 failed, 1 skipped; failed: tests/test_b.py::two" in text
    assert "| tests | 90 | 124 |" in text
    assert "steps 100-1100 took 2.5 s" in text and "**1.25x** the floor" in text
    assert "this run: 200 epochs" in text


def test_a_quiet_log_cut_by_its_limit_counts_its_progress_and_says_names_are_missing(tmp_path):
    folder = _folder(tmp_path, "bringing up nodes...\n\ns....F..sF.\n")
    report.main([str(folder)])
    text = (folder / "README.md").read_text()
    assert "so far 7 passed, 2 failed, 2 skipped; which tests failed is not in the log" in text


def test_a_finished_log_gives_pytests_own_summary(tmp_path):
    folder = _folder(tmp_path, "....\nFAILED tests/test_b.py::two - AssertionError\n"
                               "=== 1 failed, 4 passed in 3.2s ===\n")
    report.main([str(folder)])
    assert "pytest: 1 failed, 4 passed in 3.2s; failed: tests/test_b.py::two" in \
        (folder / "README.md").read_text()


def test_a_folder_without_the_main_job_says_so_without_an_epoch_count(tmp_path):
    folder = _folder(tmp_path, "=== 5 passed in 2.7s ===\n")
    (folder / "train_config.json").unlink()
    (folder / "train_metrics.jsonl").unlink()
    report.main([str(folder)])
    text = (folder / "README.md").read_text()
    assert "## The main job, `bin/train` (GEDL on MNIST)\n" in text
    assert "this run" not in text and "did not run." in text

def test_a_resume_part_without_its_json_reports_the_verdict_its_log_printed(tmp_path):
    folder = _folder(tmp_path, "=== 5 passed in 2.7s ===\n")
    verdict = ("stopped at step 750 of 1500, resumed: IDENTICAL: the resumed run equals the "
               "uninterrupted one bit for bit (70.4 s)")
    (folder / "resume_deterministic_ops.log").write_text(f"=== ...\nresume_check: {verdict}\n")
    (folder / "resume.log").write_text("Traceback (most recent call last):\n")
    report.main([str(folder)])
    text = (folder / "README.md").read_text()
    assert (f'- `--xla_gpu_deterministic_ops=true`: no resume_check.json; the log\'s last '
            f'verdict: "{verdict}"') in text
    assert ("- the trainer's flags (config.deterministic): no resume_check.json, and no verdict "
            "in resume.log") in text

def test_etas_are_set_against_the_training_time_then_left():
    # 10 steps an epoch, 100 in all, a record every 5 steps at 0.1 s a step (t = step / 10)
    records = [{"step": s, "split": "train", "time": s / 10} for s in range(5, 101, 5)]
    records += [{"step": s, "split": "validation", "time": s / 10} for s in range(10, 101, 10)]
    log = "\n".join([f"epoch {(s - 1) // 10 + 1}/10 step {s}/100 loss 1.0 | 128 img/s | "
                      f"ETA 0:{s // 60:02d}:{s % 60:02d}" for s in range(5, 101, 5)]
                     + ["epoch 1: validation accuracy 0.5 (best)"])
    text = report.eta_against_time_left(records, log)
    # the first three lines, the first after the first validation (step 10), the first past
    # 10 and 50 steps; never the last
    assert text == ("ETAs printed against the training time then left (to the last train "
                    "record): step 5: 0:00:05 for 9.5 s; step 10: 0:00:10 for 9.0 s; step 15: "
                    "0:00:15 for 8.5 s; step 55: 0:00:55 for 4.5 s.")
    assert report.eta_against_time_left(records[:1], log) is None

def test_machine_paths_are_replaced_in_the_logs_and_nothing_else(tmp_path):
    folder = _folder(tmp_path, "")
    (folder / "torch.log").write_text(
        f"$ /opt/x/.venv/bin/python3 {report.REPO}/bin/benchmark.py "
        f"--out={tempfile.gettempdir()}/gpu/jax.json\n"
        "/opt/x/.venv/lib/python3.12/site-packages/pkg/logger.py:44: a warning\n"
        "epoch 1/200 step 100/75000 loss 1.75 | 2,175 img/s\n"
        f"rootdir: {report.REPO}\n")
    report.main([str(folder)])
    assert (folder / "torch.log").read_text() == (
        "$ PYTHON bin/benchmark.py --out=TMP/jax.json\n"
        "SITE_PACKAGES/pkg/logger.py:44: a warning\n"
        "epoch 1/200 step 100/75000 loss 1.75 | 2,175 img/s\n"
        "rootdir: .\n")


def test_epoch_end_cost_is_the_time_across_an_epoch_end_beyond_its_steps():
    # 4 steps an epoch, records every 2 steps at 1 ms a step; each epoch end adds 0.05 s
    records, t = [], 0.0
    for step in range(2, 13, 2):
        t += 0.002
        records.append({"step": step, "split": "train", "time": t})
        if step % 4 == 0:
            records.append({"step": step, "split": "validation", "time": t + 0.01})
            t += 0.05
    line = report.epoch_end_cost(records)
    assert line == ("Inside an epoch, 1.000 ms a step; across an epoch end, 50 ms more (medians "
                    "over 3 intervals and 2 epoch ends of the train records' times).")
    assert report.epoch_end_cost(records[:2]) is None   # no epoch end crossed


def test_epochs_are_grouped_by_the_checkpoints_their_epoch_end_saved():
    seeds_log = ("epoch 1/3 step 4/12 loss 1.0 acc 0.5 | 9 img/s | ETA 0:00:01\n"
                 "epoch 1: validation accuracy per seed 0:0.9762* 1:0.9663* (* = best so far)\n"
                 "epoch 2: validation accuracy per seed 0:0.9836 1:0.9859* (* = best so far)\n"
                 "epoch 3: validation accuracy per seed 0:0.9800 1:0.9801 (* = best so far)\n")
    assert report.saves_per_epoch_end(seeds_log) == [4, 3, 2]
    one_seed = ("epoch 1: validation accuracy 0.9700 (best)\n"
                "epoch 2: validation accuracy 0.9600 (best 0.9700)\n")
    assert report.saves_per_epoch_end(one_seed) == [2, 1]
    records = [{"step": 4 * k, "split": "validation", "time": t}
               for k, t in enumerate([1.0, 2.5, 3.25], 1)]
    assert report.epochs_by_saves(records, seeds_log) == (
        "Epoch durations by the checkpoints saved at the epoch end before each (medians, from "
        "one validation record to the next): 3 checkpoints: 0.750 s (1 epoch); "
        "4 checkpoints: 1.500 s (1 epoch).")
    assert report.epochs_by_saves(records, one_seed) is None   # the log is not the records'


def test_a_log_with_checkpoint_lines_counts_the_saves_they_name():
    # the lines gedl_jax.run.training writes with checkpoint_interval_seconds > 0
    seeds_log = (
        "epoch 1: validation accuracy per seed 0:0.9762* 1:0.9663* (* = best so far)\n"
        "epoch 2: validation accuracy per seed 0:0.9836 1:0.9859* (* = best so far)\n"
        "epoch 2: checkpoints saving in /w/seed_*/checkpoints: last (step 8) of 2 seeds, "
        "best of 2 seeds\n"
        "epoch 3: validation accuracy per seed 0:0.9800 1:0.9801 (* = best so far)\n"
        "epoch 3: checkpoints saving in /w/seed_*/checkpoints: last (step 12) of 2 seeds\n")
    assert report.saves_per_epoch_end(seeds_log) == [0, 4, 2]
    one_seed = ("epoch 1: validation accuracy 0.9700 (best)\n"
                "epoch 1: checkpoints saving in /w/checkpoints: last (step 4), best (step 4)\n"
                "epoch 2: validation accuracy 0.9800 (best)\n"
                "epoch 3: validation accuracy 0.9600 (best 0.9800)\n"
                "epoch 3: checkpoints saving in /w/checkpoints: last (step 12), best (step 8)\n"
                "epoch 4: validation accuracy 0.9600 (best 0.9800)\n"
                "epoch 4: checkpoints saving in /w/checkpoints: last (step 16)\n")
    assert report.saves_per_epoch_end(one_seed) == [2, 0, 2, 1]


def test_links_planted_at_the_readme_and_a_log_are_replaced_not_written_through(tmp_path):
    (tmp_path / "gpu").mkdir()
    folder = _folder(tmp_path / "gpu", "")
    sentinel = tmp_path / "sentinel"
    sentinel.write_text(f"the user's own file, naming {report.REPO}/x\n")
    before = sentinel.read_bytes()
    (folder / "README.md").symlink_to(sentinel)
    (folder / "torch.log").symlink_to(sentinel)   # scrubbed of machine paths: a new file
    report.main([str(folder)])
    assert sentinel.read_bytes() == before
    assert not (folder / "README.md").is_symlink() and "NVIDIA Test" in (
        folder / "README.md").read_text()
    assert (folder / "torch.log").read_text() == "the user's own file, naming x\n"
