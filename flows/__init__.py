"""Prefect flows: batch run and merge. They compose tasks/."""
