"""cifar10 experiment: GEDL by default, any variant by name.

Usage:
  python -m gedl_jax.train --config=configs/cifar10.py --workdir=runs/cifar10_gedl
  python -m gedl_jax.train --config=configs/cifar10.py:edl --workdir=runs/cifar10_edl
  python -m gedl_jax.train --config=configs/cifar10.py:gedl,quick --workdir=runs/cifar10_quick
  python -m gedl_jax.train --config=configs/cifar10.py --config.c_w=0.7 --config.seeds=0,1,2 ...

By name, from any directory (`configs/cifar10.py` names this file from anywhere too):
  python -m gedl_jax.train --config=cifar10:gedl,quick

Variants: gedl, edl, iedl, redl, red, ablation_base, ablation_kl_all, ablation_kl_all_tau,
ablation_full. Modifier: quick (2 epochs on a subset). Every field and its meaning:
`python -m gedl_jax.train --helpfull` (gedl_jax/config/fields.py).
"""

from gedl_jax.configs import build_config


def get_config(arg=None):
    return build_config("cifar10", arg)
