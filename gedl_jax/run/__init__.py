"""The run engine: everything between a config and a finished, evaluated workdir.

Setup (`experiment`: data, splits, normalisation, the method), the compiled programs (`steps`,
`programs`, `sharding`, `optimizer`), the training loop (`training`), the run folder
(`checkpointing`, `rundir`, `progress`, `preemption`, `distributed`; `tracking`: the optional
MLflow run beside metrics.jsonl) and the run-level
evaluation (`workdir`: restore a workdir, predict, write results; `ensemble`;
`corruption_study`; `inference`: padded batched prediction). `gedl_jax.train` and
`gedl_jax.evaluate` are thin command lines over it. Scoring itself is pure and lives in
`gedl_jax.evaluation`, which imports nothing from here.
"""
