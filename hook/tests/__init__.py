"""The hook's tests. Records a run cannot send go to DEEPSEED_OFFLINE_DIR:
a temporary directory here, so that no test writes into the tree."""

import atexit
import os
import shutil
import tempfile

if not os.environ.get("DEEPSEED_OFFLINE_DIR"):
    _dir = tempfile.mkdtemp(prefix="deepseed-hook-tests-")
    os.environ["DEEPSEED_OFFLINE_DIR"] = _dir
    atexit.register(shutil.rmtree, _dir, True)
