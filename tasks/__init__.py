"""Prefect tasks: thin wrappers over hermes/."""
