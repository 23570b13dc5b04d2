"""bin/curves.py: per-epoch curves from metrics.jsonl files (written here by hand)."""

import json
import pathlib

import numpy as np
import pytest


@pytest.fixture(scope="module")
def curves():
    from bin import curves

    return curves


def _write_run(path: pathlib.Path, seed: int, steps_per_epoch: int = 4, epochs: int = 3):
    path.mkdir(parents=True)
    lines = []
    for step in range(1, steps_per_epoch * epochs + 1):
        lines.append({"step": step, "split": "train", "time": 0.0, "kl_weight": step / 100,
                      "mean_strength": 10.0 - step / 10 + seed, "mean_prior_strength": 0.5})
        if step % steps_per_epoch == 0:
            epoch = step // steps_per_epoch
            lines.append({"step": step, "split": "validation", "time": 0.0, "accuracy": 0.9})
            lines.append({"step": step, "split": "epoch_eval", "time": 0.0,
                          "accuracy": 0.9 + epoch / 100, "kmnist_mp": 0.95 - epoch / 100 * seed,
                          "test_strength": 5.0})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def test_epoch_means_and_seed_aggregation(curves, tmp_path):
    for seed in (0, 1):
        _write_run(tmp_path / "gedl" / f"seed_{seed}", seed)
    run = curves.epoch_records(tmp_path / "gedl" / "seed_1" / "metrics.jsonl")
    assert sorted(run) == [1, 2, 3]
    # epoch 2 is steps 5..8: mean kl_weight 6.5 / 100, mean strength 10 - 0.65 + 1
    np.testing.assert_allclose(run[2]["kl_weight"], 0.065)
    np.testing.assert_allclose(run[2]["mean_strength"], 10.35)
    assert run[3]["kmnist_mp"] == pytest.approx(0.92)
    assert curves.main([str(tmp_path / "gedl"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "curves.md").read_text()
    # last epoch, KMNIST MP over seeds 0 and 1: 95 and 92 -> 93.50 ± 2.12
    assert "| gedl | 2 | 3 |" in text and "93.50 ± 2.12" in text
    assert (tmp_path / "out" / "curves.png").stat().st_size > 10_000


def test_no_runs_is_a_one_line_error(curves, tmp_path, capsys):
    assert curves.main([str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "error: no metrics.jsonl" in capsys.readouterr().err


def test_links_planted_at_the_outputs_are_replaced_not_written_through(curves, tmp_path):
    sentinel = tmp_path / "user" / "sentinel"
    sentinel.parent.mkdir()
    sentinel.write_bytes(b"the user's own file\n")
    _write_run(tmp_path / "gedl", 0)
    (tmp_path / "out").mkdir()
    for name in ("curves.png", "curves.md"):
        (tmp_path / "out" / name).symlink_to(sentinel)
    assert curves.main([str(tmp_path / "gedl"), "--out", str(tmp_path / "out")]) == 0
    assert sentinel.read_bytes() == b"the user's own file\n"
    for name in ("curves.png", "curves.md"):
        assert not (tmp_path / "out" / name).is_symlink()
