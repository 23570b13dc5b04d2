"""bin/speed_vs_torch.py's driver: worker specs and the reference the ratios are taken to."""

import importlib.util
import pathlib

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "speed_vs_torch", pathlib.Path(__file__).parents[1] / "bin" / "speed_vs_torch.py")
speed_vs_torch = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(speed_vs_torch)


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
