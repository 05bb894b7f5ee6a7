"""hermes-batch domain: datasets, the agent loop, tools, sandboxes, trajectories. No Prefect here."""
