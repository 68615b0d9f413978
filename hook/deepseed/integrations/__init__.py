"""Framework integrations. Each module imports its framework when it is
itself imported, never before: ``deepseed.integrations.hf`` needs
transformers, ``.lightning`` needs Lightning, ``.deepspeed`` and
``.torch_dist`` need torch."""
