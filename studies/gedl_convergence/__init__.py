"""The GEDL convergence study's scripts (studies/README.md): `studies.gedl_convergence.<name>`."""
