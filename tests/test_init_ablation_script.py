"""bin/init_ablation.py: groups runs by variant and the varying config fields, per-seed rows and
mean ± sample std (ddof=1) checked against NumPy."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import numpy as np

_SPEC = importlib.util.spec_from_file_location(
    "init_ablation", pathlib.Path(__file__).parents[1] / "bin" / "init_ablation.py")
init_ablation = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(init_ablation)


def _write_run(folder: pathlib.Path, init: str, seed: int, acc: float, aupr: float) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(
        {"variant": "gedl", "init": init, "seed": seed, "tau_reading": "epoch"}))
    det = {"mp": {"aupr_in": aupr}, "um": {"aupr_in": aupr - 0.01}}
    (folder / "eval_results.json").write_text(json.dumps(
        {"id": {"accuracy": acc}, "ood": {"kmnist": {"detection": det}}}))


def test_table_groups_by_init_and_averages(tmp_path, capsys):
    accs = {"torch": [0.981, 0.986], "flax": [0.990, 0.991, 0.993]}
    for init, values in accs.items():
        for seed, acc in enumerate(values):
            _write_run(tmp_path / f"gedl_{init}" / f"seed_{seed}", init, seed, acc, acc - 0.02)
    out = tmp_path / "t.md"
    assert init_ablation.main([str(tmp_path), "--ood=kmnist,fashion_mnist",
                               f"--out={out}"]) == 0
    text = out.read_text()
    lines = text.splitlines()
    assert lines[0] == ("| variant | init | seed | Acc | kmnist MP | kmnist UM | fashion_mnist MP "
                        "| fashion_mnist UM |")   # tau_reading has one value: not a column
    flax_mean = [ln for ln in lines if ln.startswith("| gedl | flax | mean")][0]
    x = 100 * np.array(accs["flax"])
    assert f"**{x.mean():.2f} ± {x.std(ddof=1):.2f}**" in flax_mean
    k = x - 2
    assert f"**{k.mean():.2f} ± {k.std(ddof=1):.2f}**" in flax_mean
    assert flax_mean.endswith("| – | – |")                      # no fashion_mnist results
    assert sum(ln.startswith("| gedl | torch | ") for ln in lines) == 3   # 2 seeds + mean
    assert capsys.readouterr().out.strip() == text.strip()
