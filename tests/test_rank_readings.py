"""studies/gedl_convergence/rank_readings.py: the distance of each reading to the paper's
MNIST row, on a results.json whose numbers are known."""

import json



def _load():
    from studies.gedl_convergence import rank_readings

    return rank_readings


def _aggregate(acc, conf, k_mp, k_um, f_mp, f_um):
    mean = lambda v: {"mean": v / 100, "std": 0.0, "n": 3}  # noqa: E731
    det = lambda mp, um: {"mp": {"aupr_in": mean(mp)}, "um": {"aupr_in": mean(um)}}  # noqa: E731
    return {"id": {"accuracy": mean(acc), "misclassification": {"mp": {"aupr": mean(conf)}}},
            "ood": {"kmnist": {"detection": det(k_mp, k_um)},
                    "fashion_mnist": {"detection": det(f_mp, f_um)}}}


def test_distance_and_shortfall_against_the_papers_row(tmp_path, capsys):
    rank_readings = _load()
    paper = rank_readings.paper_row()
    assert paper == [99.58, 99.95, 99.80, 99.70, 98.54, 98.99]
    results = {"args": {"seeds": "0,1,2"}, "aggregate": {
        "exact": _aggregate(*paper),
        # 6 points below on FMNIST UM, 0.6 above on accuracy: mean |diff| (6 + 0.6) / 6
        "off": _aggregate(paper[0] + 0.6, *paper[1:5], paper[5] - 6.0),
    }}
    rows = rank_readings.rank(results)
    assert [r[0] for r in rows] == ["exact", "off"]
    assert abs(rows[0][2]) < 1e-9 and rows[0][3][1] == 0.0
    assert abs(rows[1][2] - 6.6 / 6) < 1e-9
    assert rows[1][3][0] == "FMNIST UM" and abs(rows[1][3][1] - 6.0) < 1e-9
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert rank_readings.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| `off` | 100.18 |" in out and "| 1.10 | 6.00 (FMNIST UM) |" in out
    assert rank_readings.main([str(tmp_path / "missing.json")]) == 2
