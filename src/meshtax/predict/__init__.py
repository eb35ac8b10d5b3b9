"""meshtax.predict."""
