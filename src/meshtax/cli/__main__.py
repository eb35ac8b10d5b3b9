"""``python -m meshtax.cli``."""

from meshtax.cli import main

main()
