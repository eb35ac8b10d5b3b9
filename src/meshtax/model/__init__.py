"""meshtax.model."""
