"""The options of a run, in one place: what :func:`deepseed.init` and
:class:`deepseed.run.Run` take, each with its default and the environment
variable that stands in for it when it is not given."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass
class RunOptions:
    """Everything a :class:`~deepseed.run.Run` is started with.

    What the run is:

    - ``project``, ``name``: where the run is listed and what it is called
      (``DEEPSEED_PROJECT``, ``DEEPSEED_NAME``; project ``default``).
    - ``run_id``: the run's id, shared by its ranks (``DEEPSEED_RUN_ID``;
      otherwise one the ranks agree on, see ``env.shared_run_id``).
    - ``sweep_id``: the sweep the run belongs to (``DEEPSEED_SWEEP_ID``).
    - ``config``: the training configuration, a dict or a JSON file's path
      (a DeepSpeed config also describes the run: ZeRO stage, batches).
    - ``params``: the hyperparameters, a dict or a JSON file's path (a job
      an agent started gets its own, ``DEEPSEED_PARAMS``).
    - ``tags``: labels to find the run by.
    - ``meta``: more of the run's description (model, precision, ...),
      over what the hook finds itself.
    - ``total_steps``: the steps the run will take, for its time to finish
      (integrations read it from the framework otherwise).

    Where its records go (sender.py):

    - ``collector_url``: the node's collector (``DEEPSEED_COLLECTOR_URL``,
      default ``http://127.0.0.1:9464``; its token ``DEEPSEED_COLLECTOR_TOKEN``).
    - ``server_url``, ``token``: straight to a server instead, with an
      ingest token (``DEEPSEED_SERVER_URL``, ``DEEPSEED_TOKEN``).
    - ``mode``: ``online``, ``offline`` (to a file only) or ``disabled``
      (``DEEPSEED_MODE``).
    - ``file``: a file the records go to instead of the network
      (``DEEPSEED_FILE``; offline without one, a file named by the run).
    - ``max_queue``, ``batch_size``, ``flush_interval``, ``compress``: the
      sender's queue bound, records a request, seconds between requests,
      and gzip (None: ``DEEPSEED_GZIP`` if set, else on unless the
      destination is this machine's loopback, as the node's collector is).
    - ``flush_timeout``: how long finish() waits for records to leave, in
      seconds (``DEEPSEED_FLUSH_TIMEOUT``, default 5).

    What it measures:

    - ``layer_every``: per-layer timings every this many steps, 0 for none
      (``DEEPSEED_LAYER_EVERY``, default 10, spaced in time on fast steps).
    - ``flops_per_token``, ``peak_tflops``: TFLOP/s and MFU from these
      instead of the estimates from the watched model and the GPU.

    How it lives in the process:

    - ``handle_signals``: finish the run on SIGTERM and watch for hangs
      (the watchdog, hang.py).
    """

    project: Optional[str] = None
    name: Optional[str] = None
    config: Any = None
    params: Any = None
    tags: Any = None
    run_id: Optional[str] = None
    sweep_id: Optional[str] = None
    collector_url: Optional[str] = None
    server_url: Optional[str] = None
    token: Optional[str] = None
    layer_every: Optional[int] = None
    meta: Optional[dict] = None
    mode: Optional[str] = None
    max_queue: int = 10000
    batch_size: int = 500
    flush_interval: float = 1.0
    flush_timeout: Optional[float] = None
    compress: Optional[bool] = None
    file: Optional[str] = None
    handle_signals: bool = True
    flops_per_token: Optional[float] = None
    peak_tflops: Optional[float] = None
    total_steps: Optional[int] = None
