"""studies/checkpoint_save_cost.py: every epoch end's saves reach the disk through the saver
thread, and the script prints one line per epoch end and their median (a smoke run on the
MLP's train state, two seeds)."""

import re

from studies import checkpoint_save_cost


def test_prints_each_epoch_end_and_the_median(capsys):
    checkpoint_save_cost.main(["--model=mlp", "--seeds=2", "--epoch_ends=3"])
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"mlp train state: \d+ arrays, [\d.]+ MiB; 2 seed\(s\) x \(best \+ last\)",
                    lines[0])
    assert [line.split(":")[0] for line in lines[1:4]] == \
        ["epoch end 1", "epoch end 2", "epoch end 3"]
    assert re.match(r"median of epoch ends 2-3: \d+ ms to disk, \d+ ms of CPU, for 4 saves$",
                    lines[4])
