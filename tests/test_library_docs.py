"""docs/library.md: the own-loop example runs as written, and it trains (the loss goes down)."""

import re
from pathlib import Path

import numpy as np

LIBRARY = Path(__file__).resolve().parents[1] / "docs" / "library.md"


def _own_loop_example() -> str:
    text = LIBRARY.read_text()
    section = text.split("## Your own loop", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_own_loop_example_runs_verbatim_and_the_loss_goes_down(fast_compile, capsys):
    code = _own_loop_example()
    namespace: dict = {"__name__": "library_example"}
    exec(compile(code, str(LIBRARY), "exec"), namespace)  # noqa: S102
    history, per_epoch = namespace["history"], namespace["steps_per_epoch"]
    epochs = [history[i:i + per_epoch] for i in range(0, len(history), per_epoch)]
    assert len(epochs) == 4 and all(len(e) == per_epoch for e in epochs)

    def mean(epoch, name):
        return float(np.mean([m[name] for m in epoch]))

    losses = [mean(e, "loss") for e in epochs]
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses                   # the loss goes down
    assert mean(epochs[-1], "likelihood") < 0.5 * mean(epochs[0], "likelihood")
    assert mean(epochs[-1], "accuracy") > 0.9
    kl_weights = [e[-1]["kl_weight"] for e in epochs]             # 1/tau grows (GEDL)
    assert all(b > a for a, b in zip(kl_weights, kl_weights[1:])), kl_weights
    assert [int(e[0]["epoch"]) for e in epochs] == [0, 1, 2, 3]
    assert capsys.readouterr().out.count("epoch ") == 4
    # The predictions at the end of the example: a Dirichlet per example.
    probs, u = np.asarray(namespace["probs_BxK"]), np.asarray(namespace["u_B"])
    assert probs.shape == (8, 4) and u.shape == (8,)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert np.all((u > 0) & (u < 1))
