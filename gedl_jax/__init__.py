"""gedl-jax: Generalized Evidential Deep Learning in JAX/Flax.

The evidential math lives in `gedl_jax.evidential` (pure functions of arrays); datasets in
`gedl_jax.data`; models, losses, the shard_map train step and the CLI in the other modules
(see docs/architecture.md).
"""

__version__ = "0.1.0"
