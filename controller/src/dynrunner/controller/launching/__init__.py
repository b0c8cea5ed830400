"""Launching: deliveries become environments, and their starts are followed until the executor runs."""
