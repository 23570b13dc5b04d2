"""studies/checkpoint_save_cost.py: every epoch end's saves reach the disk through the saver
thread, and the script prints one line per epoch end and their median (a smoke run on the
MLP's train state, two seeds); beside the steps (`--dry_run`), one line per setting, the saves
of each epoch on disk (the script checks)."""

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


def test_beside_steps_times_the_loop_alone_and_beside_each_kind_of_save(capsys):
    checkpoint_save_cost.main(["--dry_run", "--seeds=2", "--settings=alone,saves_sync"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("mlp, 2 seed(s) vmapped, batch 128, 2 steps a call, 2 calls an "
                               "epoch, 2 epochs; 4 saves at each epoch end; jax ")
    assert [line.split(":")[0] for line in lines[1:]] == ["alone", "saves_sync"]
    assert all(re.search(r": [\d,]+ img/s, [\d.]+ ms a step \(8 steps in [\d.]+ s\)$", line)
               for line in lines[1:])


def test_layouts_time_one_save_of_each_layout(capsys):
    checkpoint_save_cost.main(["--layouts", "--model=mlp"])
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"mlp train state: \d+ arrays, [\d.]+ MiB; one save each, jax ", lines[0])
    assert [line.split(":")[0] for line in lines[1:]] == \
        ["every array + metadata", "every array", "one array + metadata", "one array"]
