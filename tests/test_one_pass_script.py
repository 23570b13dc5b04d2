"""studies/one_pass_step.py: its two-pass build wraps the user network for two passes (and
only within), and it prints its table (a smoke run on the MLP, one round of one step)."""

from studies import one_pass_step
from gedl_jax import config as config_lib
from gedl_jax import configs
from gedl_jax.methods import common


def test_the_two_pass_build_wraps_the_network_for_two_passes_and_the_table_prints(capsys):
    config = config_lib.resolve(config_lib.set_fields(configs.build_config("cifar10", "daedl"),
                                                      model="mlp"))
    assert common.backbone(config, 10, axis_name=None).one_pass
    with one_pass_step.two_pass_backbones():
        assert not common.backbone(config, 10, axis_name=None).one_pass
    assert common.backbone(config, 10, axis_name=None).one_pass

    assert one_pass_step.main(["--models=mlp", "--variants=daedl", "--batch=8", "--steps=1",
                               "--rounds=1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("| method | network | one pass (ms/step) | two passes (ms/step) "
                        "| two / one |")
    assert lines[3].startswith("| daedl | mlp | ")
