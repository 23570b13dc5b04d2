"""studies/gedl_convergence/evidence_split.py: total evidence and the UM ranking per set,
on Dirichlets built from known evidence with the library's own prior."""

import types

import numpy as np
import pytest

from gedl_jax.evidential import prior

from studies.gedl_convergence import evidence_split as split


def _predictions(evidence_NxK):
    """alpha = e + W a with GEDL's adaptive W (C_w = 0.5) and a uniform base rate."""
    e = np.asarray(evidence_NxK, np.float32)
    w = prior.adaptive_prior_strength(e, 0.5)
    alpha = prior.dirichlet_alpha(e, w, prior.uniform_base_rate(e.shape[1]))
    return types.SimpleNamespace(alpha=np.asarray(alpha), prior_strength=np.asarray(w))


def _evidence(totals, num_classes=10):
    """Each image's evidence all on class 0, with the given totals."""
    e = np.zeros((len(totals), num_classes))
    e[:, 0] = totals
    return e


def test_evidence_is_recovered_and_u_falls_as_evidence_grows():
    totals = np.array([0.2, 0.875, 1.0, 3.0])
    p = _predictions(_evidence(totals))
    e, u = split.evidence_and_uncertainty(p.alpha, p.prior_strength)
    np.testing.assert_allclose(e, totals, rtol=1e-5)
    assert np.all(np.diff(u) < 0)
    s = p.alpha.sum(1)
    # S = W + E is smallest near E = (sqrt(K (K - C_w)) - 1) / K = 0.875, larger on both sides
    assert s[1] < s[0] and s[1] < s[2] < s[3]


def test_shares_against_the_test_set():
    rng = np.random.default_rng(0)
    test = _predictions(_evidence(np.full(200, 1.0) + rng.normal(0, 1e-3, 200)))
    # 30 of 100 OOD images hold more evidence than every test image, 70 less
    ood = _predictions(_evidence(np.r_[np.full(30, 2.0), np.full(70, 0.3)]))
    rows = {r.name: r for r in split.evidence_split({"test": test, "ood": ood})}
    assert rows["test"].images == 200 and rows["ood"].images == 100
    assert rows["test"].above_test_median_rank == pytest.approx(0.5, abs=0.01)
    assert rows["ood"].above_test_median_evidence == pytest.approx(0.3)
    assert rows["ood"].above_test_median_rank == pytest.approx(0.3)
    assert rows["ood"].above_test_top_rank == pytest.approx(0.3)
    assert rows["ood"].evidence_mean == pytest.approx(0.3 * 2.0 + 0.7 * 0.3, rel=1e-5)
    lines = split.table(list(rows.values()))
    assert lines[2].startswith("| test | 200 |") and "| 0.300 | " in lines[3]


def test_a_set_without_a_dirichlet_is_refused():
    test = _predictions(_evidence([1.0]))
    softmax = types.SimpleNamespace(alpha=None, prior_strength=None)
    with pytest.raises(ValueError, match="no Dirichlet"):
        split.evidence_split({"test": test, "ood": softmax})
    with pytest.raises(ValueError, match="no 'test' set"):
        split.evidence_split({"ood": test})


def test_the_command_line(tmp_path, monkeypatch, capsys):
    seen = []

    def fake_workdir(path):
        seen.append(("workdir", path))
        return {"test": _predictions(_evidence([1.0, 1.0])),
                "kmnist": _predictions(_evidence([0.5, 2.0]))}

    def fake_pretrained(name):
        seen.append(("pretrained", name))
        return {"test": _predictions(_evidence([1.0, 1.0])),
                "fashion_mnist": _predictions(_evidence([3.0, 3.0]))}

    monkeypatch.setattr(split, "workdir_predictions", fake_workdir)
    monkeypatch.setattr(split, "pretrained_predictions", fake_pretrained)
    out = tmp_path / "split.md"
    run = tmp_path / "a" / "b" / "seed_0"
    assert split.main([str(run), "--pretrained=mnist/gedl", f"--out={out}"]) == 0
    text = capsys.readouterr().out
    assert seen == [("workdir", run), ("pretrained", "mnist/gedl")]
    assert text.startswith("### a/b/seed_0\n") and "| kmnist | 2 | 1.250 |" in text
    assert text.index("### a/b/seed_0") < text.index("### mnist/gedl")
    assert "| fashion_mnist | 2 | 3.000 | 3.000 | 1.000 |" in text
    assert out.read_text().rstrip() == text.rstrip()
    assert split.main([str(tmp_path / "x"), str(tmp_path / "y"), "--names=one,two"]) == 0
    text = capsys.readouterr().out
    assert text.index("### one") < text.index("### two")
    for bad in ([str(tmp_path / "x"), "--names=one,two"], []):
        with pytest.raises(SystemExit):
            split.main(bad)
    monkeypatch.setattr(split, "workdir_predictions",
                        lambda path: (_ for _ in ()).throw(FileNotFoundError("no config.json")))
    assert split.main([str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_a_pretrained_name_that_is_not_registered_is_one_error_line(capsys):
    assert split.main(["--pretrained=mnist/nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evidence_split.py: mnist/nope: ") and err.count("\n") == 1
