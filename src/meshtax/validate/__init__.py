"""Validation against real multi-service applications: measured vs predicted overhead.

:mod:`meshtax.validate.appctl` builds and runs the topology-driven application (``app/``).
"""
