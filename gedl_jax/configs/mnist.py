"""mnist experiment: GEDL by default, any variant by name.

Usage:
  python -m gedl_jax.train --config=configs/mnist.py --workdir=runs/mnist_gedl
  python -m gedl_jax.train --config=configs/mnist.py:edl --workdir=runs/mnist_edl
  python -m gedl_jax.train --config=configs/mnist.py:gedl,quick --workdir=runs/mnist_quick
  python -m gedl_jax.train --config=configs/mnist.py --config.c_w=0.7 --config.seeds=0,1,2 ...

By name, from any directory (`configs/mnist.py` names this file from anywhere too):
  python -m gedl_jax.train --config=mnist:gedl,quick

Variants: gedl, edl, iedl, redl, red, ablation_base, ablation_kl_all, ablation_kl_all_tau,
ablation_full. Modifier: quick (2 epochs on a subset). Every field and its meaning:
`python -m gedl_jax.train --helpfull` (gedl_jax/config/fields.py).
"""

from gedl_jax.configs import build_config


def get_config(arg=None):
    return build_config("mnist", arg)
