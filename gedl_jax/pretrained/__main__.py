"""`python -m gedl_jax.pretrained export|list|reexport`: the command is
gedl_jax/commands/pretrained.py (its docstring, or --help, says what each does)."""

import sys

if __name__ == "__main__":
    from gedl_jax.commands import pretrained as command

    sys.exit(command.main())
