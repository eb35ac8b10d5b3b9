"""meshtax.store."""
