"""meshtax.traces."""
