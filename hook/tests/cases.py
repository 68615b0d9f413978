"""What the offline tests set up alike."""

import logging
import tempfile


def quiet_tempdir(test):
    """A temporary directory for test's files, removed after it, with the
    hook's log at ERROR meanwhile (offline runs say at the end where their
    records are: not news in a test). Returns the directory's path."""
    tmp = tempfile.TemporaryDirectory(prefix="deepseed-test-")
    test.addCleanup(tmp.cleanup)
    log = logging.getLogger("deepseed")
    test.addCleanup(log.setLevel, log.level)
    log.setLevel(logging.ERROR)
    return tmp.name
