"""Pure math of the paper's non-EDL baselines (no Flax, no I/O), as `evidential/` is for EDL.

- `prior_networks`: KL-PN (forward KL to Dirichlet targets) and RKL-PN (reverse KL);
  Malinin & Gales, NeurIPS 2018 and 2019 (KaosEngineer/PriorNetworks).
- `duq`: DUQ's RBF head, centroid moving averages, BCE and two-sided gradient penalty;
  van Amersfoort et al., ICML 2020 (y0ast/deterministic-uncertainty-quantification).
- `postnet`: Posterior Networks' radial flows, pseudo-counts in log space, UCE with the entropy
  term; Charpentier et al., NeurIPS 2020 (sharpenb/Posterior-Network).
- `daedl`: DAEDL's class-conditional Gaussian density on features and density-scaled logits;
  Yoon & Kim, ICML 2024 (TaeseongYoon/DAEDL).
- `fedl`: F-EDL's Flexible Dirichlet moments, loss and uncertainty decomposition;
  Yoon & Kim, NeurIPS 2025 (TaeseongYoon/F-EDL).

Every function returns per-example values (callers reduce), acts on the last axis, and is
jit/vmap/grad-safe; the GDA fit in `daedl` is the one host-side (NumPy float64) step.
"""

from gedl_jax.baselines import daedl, duq, fedl, postnet, prior_networks

__all__ = ["daedl", "duq", "fedl", "postnet", "prior_networks"]
