"""hermes-batch's domain: no Prefect here. Its folders are its layers, from the top down; a module
imports only from its own layer and those below it (tests/test_layers.py holds them to it):

    run/, api/      one run's life (plan, batches, merge, status); the OpenAI-compatible API server
    agent/          one prompt's agent loop and its conversation in a sandbox
    model/          the model endpoint: client, calls, rate limiting
    settings.py     the run's settings
    data/, tools/   what a run reads and writes; the toolsets
    sandbox/        where model-written commands run
    netpolicy.py, lazyimport.py
"""
