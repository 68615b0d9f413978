"""What the GPU checks' server sides share (standard library only, so they
run where the records are checked, with no torch): reading the API, and
importing a device run's captured records into a running `deepseed serve`."""

import gzip
import json
import os
import subprocess
import tempfile
import urllib.request


def get(url):
    """GET url from the server as JSON, with DEEPSEED_TOKEN when set."""
    req = urllib.request.Request(url)
    token = os.environ.get("DEEPSEED_TOKEN")
    if token:  # an ingest token may also read
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def import_records(path, deepseed, server):
    """Imports the captured records at path (.ndjson.gz) into server with
    the deepseed binary, without their end records (a finished run is not
    evaluated; live, the alerts open while the run trains), and returns
    the runs' ids by name."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [ln for ln in f if ln.strip()]
    recs = [json.loads(ln) for ln in lines]
    runs = {r.get("name") or r["run_id"]: r["run_id"] for r in recs if r.get("kind") == "run"}
    tmp = tempfile.NamedTemporaryFile("w", suffix=".ndjson", delete=False)
    tmp.writelines(ln for ln, r in zip(lines, recs) if r.get("kind") != "end")
    tmp.close()
    try:
        subprocess.run([deepseed, "import", tmp.name, "--server", server], check=True)
    finally:
        os.unlink(tmp.name)
    return runs
