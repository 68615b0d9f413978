"""Framework integrations. Each module imports its framework when it is
itself imported, never before: ``deepseed.integrations.hf`` needs
transformers, ``.lightning`` needs Lightning, ``.deepspeed`` and
``.torch_dist`` need torch."""


def resumed_from(run, step):
    """Says a fit resumed from a checkpoint at step (the server's ledger
    counts the time from that checkpoint to the restart as lost)."""
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        run.event("resume", "resumed from the checkpoint of step %d" % step, step=step)
