"""meshtax.profile."""
