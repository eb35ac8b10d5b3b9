"""meshtax.report."""
