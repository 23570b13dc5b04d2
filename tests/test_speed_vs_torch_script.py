"""studies/speed_vs_torch.py's driver: worker specs and the reference the ratios are taken to."""

import pytest

from studies import speed_vs_torch


def test_parse_worker_options():
    w = speed_vs_torch.parse_worker(
        "t1:torch:/py:threads=1;env:OMP_NUM_THREADS=1;dtype=bfloat16")
    assert (w["label"], w["kind"], w["python"]) == ("t1", "torch", "/py")
    assert (w["threads"], w["dtype"], w["env"]) == (1, "bfloat16", {"OMP_NUM_THREADS": "1"})
    with pytest.raises(SystemExit, match="KIND"):
        speed_vs_torch.parse_worker("x:tf:/py")
    with pytest.raises(SystemExit, match="unknown option"):
        speed_vs_torch.parse_worker("x:jax:/py:cores=3")


def test_reference_is_the_fastest_torch_worker_of_each_round():
    workers = [{"label": "jax", "kind": "jax", "times": [1.0, 1.0, 1.0]},
               {"label": "t1", "kind": "torch", "times": [2.0, 1.5, 3.0]},
               {"label": "t2", "kind": "torch", "times": [1.0, 2.5, 0.5]}]
    label, times = speed_vs_torch.reference_times(workers, None)
    assert label == "torch-best" and times == [1.0, 1.5, 0.5]
    label, times = speed_vs_torch.reference_times(workers, "t1")
    assert label == "t1" and times == [2.0, 1.5, 3.0]


def _write_run(path, workers):
    import json
    path.write_text(json.dumps({"workers": workers}))


def test_pooled_ratios_take_each_round_to_that_rounds_fastest_torch(tmp_path):
    torch_info = {"info": {"torch": "2.13.0"}}
    _write_run(tmp_path / "a.json", {
        "jax": {"img_per_s": [100.0, 120.0], "info": {"jax": "0.12"}},
        "t1": {"img_per_s": [50.0, 130.0], **torch_info},
        "t2": {"img_per_s": [80.0, 60.0], **torch_info}})
    _write_run(tmp_path / "b.json", {
        "default": {"img_per_s": [90.0], "info": {"jax": "0.12"}},
        "t2": {"img_per_s": [100.0], **torch_info}})
    ratios = speed_vs_torch.pooled_ratios([f"{tmp_path / 'a.json'}:jax",
                                           f"{tmp_path / 'b.json'}:default"])
    assert ratios == pytest.approx([100 / 80, 120 / 130, 90 / 100])
    with pytest.raises(SystemExit, match="no worker 'jax'"):
        speed_vs_torch.pooled_ratios([f"{tmp_path / 'b.json'}:jax"])


def test_summary_of_ratios_median_interval_and_share_above_one():
    s = speed_vs_torch.summarize_ratios([0.9, 1.0, 1.1, 1.2, 1.3], resamples=2000)
    assert s["rounds"] == 5 and s["median"] == pytest.approx(1.1)
    assert s["above_1"] == pytest.approx(0.6)
    lo, hi = s["ci95"]
    assert 0.9 <= lo < 1.1 < hi <= 1.3
    # Identical rounds: the interval collapses onto the median.
    assert speed_vs_torch.summarize_ratios([1.05] * 7, resamples=200)["ci95"] == (1.05, 1.05)
