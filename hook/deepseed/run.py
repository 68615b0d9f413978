"""The Run: registration, step/eval/event/memory records, and the end of a
run on finish, at exit, or when the script dies. How a value is placed in
a record (its known fields, numbers, tensors) is in records.py; where the
records go (the run's sender) is chosen in sender.py; what the Run shares
with its watcher, its watchdog and the integrations is its RunLink
(link.py)."""

from __future__ import annotations

import atexit
import collections
import logging
import os
import signal
import sys
import threading
import time

from . import env, flops, hang
from .link import RunLink
from .options import RunOptions
from .records import Pending, clean_fields, derive_throughput, num, place, positive, is_tensor
from .sender import sender_for

log = logging.getLogger("deepseed")

_current = None


def current():
    """The run started last by :func:`deepseed.init` in this process, or None."""
    return _current


class Run:
    """One training run as seen from this process (one rank).

    Create it with :func:`deepseed.init`. Every method is safe to call from
    the training loop: errors are logged once and swallowed, and nothing
    waits on the network or the GPU.
    """

    def __init__(self, project=None, name=None, config=None, params=None, tags=None, run_id=None, sweep_id=None,
                 collector_url=None, server_url=None, token=None, layer_every=None, meta=None, mode=None,
                 max_queue=10000, batch_size=500, flush_interval=1.0, flush_timeout=None, compress=None,
                 file=None, handle_signals=True, flops_per_token=None, peak_tflops=None, total_steps=None):
        """Starts the run; the options are :class:`~deepseed.options.RunOptions`'s."""
        self.options = o = RunOptions(
            project=project, name=name, config=config, params=params, tags=tags, run_id=run_id, sweep_id=sweep_id,
            collector_url=collector_url, server_url=server_url, token=token, layer_every=layer_every, meta=meta,
            mode=mode, max_queue=max_queue, batch_size=batch_size, flush_interval=flush_interval,
            flush_timeout=flush_timeout, compress=compress, file=file, handle_signals=handle_signals,
            flops_per_token=flops_per_token, peak_tflops=peak_tflops, total_steps=total_steps)
        # What the run shares with its watcher, watchdog and integrations
        # (link.py). Its lock is bound here too: log_step takes it every step.
        self._link = link = RunLink(self)
        self._lock = link.lock
        self.finished = False
        self.status = None
        self.started = time.time()
        # A period the caller set (here or in the environment) is kept
        # exactly; the default one is spaced in time on fast steps (see
        # steps.SAMPLE_MIN_MS).
        self.layer_every_set = o.layer_every is not None or env.is_set("DEEPSEED_LAYER_EVERY")
        self.layer_every = int(env.env_period("DEEPSEED_LAYER_EVERY", 10 if o.layer_every is None else o.layer_every)
                               or 0)
        self.flush_timeout = float(o.flush_timeout if o.flush_timeout is not None
                                   else os.environ.get("DEEPSEED_FLUSH_TIMEOUT", 5.0))
        self._identify(o)
        self._describe_run(o)
        self._sender = sender_for(self.run_id, self.rank, self.world_size, o.mode, o.collector_url, o.server_url,
                                  o.token, o.max_queue, o.batch_size, o.flush_interval, o.compress, o.file)
        link.send = self._sender.put
        self._pending = collections.deque()
        self._last_step_time = None
        self._announce()
        atexit.register(self._atexit)
        self._install_excepthook()
        self._own_sigterm = False
        self._watchdog = None
        if o.handle_signals:
            self._install_sigterm()
        self._watchdog = hang.start(link, self._own_sigterm) if o.handle_signals else None

    def _identify(self, o):
        """Who the run is: this process's rank, the run's project, name,
        sweep and id, its configuration, parameters and tags."""
        self.rank, self.local_rank, self.world_size = env.dist_info()
        self.project = o.project or os.environ.get("DEEPSEED_PROJECT") or "default"
        self.name = o.name or os.environ.get("DEEPSEED_NAME") or ""
        self.sweep_id = o.sweep_id or os.environ.get("DEEPSEED_SWEEP_ID") or ""
        self.run_id = str(o.run_id or os.environ.get("DEEPSEED_RUN_ID")
                          or env.shared_run_id(self.project, self.world_size))
        self.config = env.load_config(o.config)
        params = o.params
        self.params = dict(params) if isinstance(params, dict) else (env.load_config(params) if params else None)
        if self.params is None:
            self.params = env.job_params()
        self.tags = [str(t) for t in (o.tags or [])]

    def _describe_run(self, o):
        """The run's meta: the process, its job and commit, what a DeepSpeed
        config says, the caller's meta over it, the steps to take, and
        TFLOP/s and MFU's inputs (flops.py)."""
        self.meta = {
            "world_size": self.world_size,
            "command": env.command(),
            "host": env.host(),
            "versions": env.versions(),
        }
        self.meta.update(env.job_ids())
        commit = env.git_commit()
        if commit:
            self.meta["git_commit"] = commit
        if env.looks_like_ds_config(self.config):
            self.meta.update(env.meta_from_ds_config(self.config, self.world_size))
        if o.meta:
            self.meta.update({k: v for k, v in o.meta.items() if v is not None})
        # The steps the run will take: the server estimates a running run's
        # time to finish from them. Integrations fill it in from the
        # framework (scheduler total_num_steps, max_steps) unless given here.
        self._total_steps_given = env.total_steps(o.total_steps) is not None
        if self._total_steps_given:
            self.meta["total_steps"] = env.total_steps(o.total_steps)
        # TFLOP/s and MFU (flops.py): overrides, else estimated from the
        # watched model and the GPU; both land in meta.
        self._flops_override = positive(o.flops_per_token)
        self._peak_override = positive(o.peak_tflops)
        self._refresh_flops()

    def _announce(self):
        """The process record and the run record, with the run's code on
        rank 0 (the server keeps it when later run records lack it)."""
        self._link.send({"kind": "process", "run_id": self.run_id, "rank": self.rank, "local_rank": self.local_rank,
                         "pid": os.getpid(), "host": self.meta["host"]})
        code = None
        if self.rank == 0 and os.environ.get("DEEPSEED_CAPTURE_CODE", "1").strip().lower() not in ("0", "false", "no",
                                                                                                  "off"):
            try:
                code = env.capture_code()
            except Exception as e:
                self._link.warn_once("code", "deepseed: could not read the run's code: %s", e)
        self._send_run_record(code=code)

    # ---- setup ---------------------------------------------------------------

    def _install_excepthook(self):
        prev = sys.excepthook

        def hook(tp, value, tb):
            try:
                if not self.finished:
                    status = "killed" if issubclass(tp, KeyboardInterrupt) else "failed"
                    self.finish(status=status, summary={"error": ("%s: %s" % (tp.__name__, value))[:2000]})
            except Exception:
                pass
            prev(tp, value, tb)

        sys.excepthook = hook

    def _install_sigterm(self):
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            cur = signal.getsignal(signal.SIGTERM)
        except Exception:
            return
        if getattr(cur, "deepseed_handler", False):  # an earlier run's: it serves this one too
            self._own_sigterm = True
            return
        if cur is not signal.SIG_DFL:
            return

        def on_term(signum, frame):
            try:
                for r in (self, _current):
                    if r is not None and r._watchdog is not None and not r.finished:
                        r._watchdog.report("SIGTERM")
                # Only the first run of a process installs this handler; a
                # later run of the same process (one after another, as in a
                # sweep) is the current one when the signal comes.
                for r in (self, _current):
                    if r is not None and not r.finished:
                        r.finish(status="killed", summary={"error": "SIGTERM"})
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        on_term.deepseed_handler = True
        try:
            signal.signal(signal.SIGTERM, on_term)
            self._own_sigterm = True
        except Exception:
            pass

    # ---- records ------------------------------------------------------------

    @property
    def sender(self):
        return self._sender

    @property
    def step(self):
        """The number the next watched step will get."""
        return self._link.next_step

    @property
    def steps_logged(self):
        """Steps recorded so far."""
        return self._link.steps_logged

    def _send_run_record(self, code=None):
        if self.rank != 0:
            return
        meta = {k: v for k, v in self.meta.items() if v is not None and v != ""}
        rec = {"kind": "run", "run_id": self.run_id, "project": self.project, "started_at": self.started,
               "meta": meta}
        if self.name:
            rec["name"] = self.name
        if self.config is not None:
            rec["config"] = self.config
        if self.params:
            rec["params"] = self.params
        if self.tags:
            rec["tags"] = self.tags
        if self.sweep_id:
            rec["sweep_id"] = self.sweep_id
        if code:
            rec["code"] = code
        self._link.send(rec)

    def update_meta(self, **meta):
        """Adds to the run's meta (model, gpu, zero_stage, precision, …) and
        sends the run record again; the server keeps the newer fields."""
        try:
            with self._lock:
                self.meta.update({k: v for k, v in meta.items() if v is not None})
                self._refresh_flops()
                self._send_run_record()
        except Exception as e:
            self._link.warn_once("meta", "deepseed: update_meta: %s", e)

    def set_total_steps(self, total_steps):
        """Records how many optimizer steps the run will take (the server
        then estimates a running run's time to finish). Integrations call
        it with what the framework knows; a value given to init() wins."""
        n = env.total_steps(total_steps)
        if n is None or (self._total_steps_given and self.meta.get("total_steps")):
            return
        if self.meta.get("total_steps") != n:
            self.update_meta(total_steps=n)

    def _refresh_flops(self):
        m, link = self.meta, self._link
        link.fpt = self._flops_override or flops.flops_per_token(m.get("params"), link.flops_cfg, m.get("seq_len"))
        link.peak = self._peak_override or flops.peak_tflops(m.get("gpu"), m.get("precision"))
        if link.fpt:
            m["flops_per_token"] = float(link.fpt)
        if link.peak:
            m["peak_tflops"] = float(link.peak)

    def set_flops(self, flops_per_token=None, peak_tflops=None):
        """Overrides the model FLOPs per token and the GPU's peak TFLOP/s
        that TFLOP/s and MFU of each step are computed with."""
        with self._lock:
            if flops_per_token is not None:
                self._flops_override = positive(flops_per_token)
            if peak_tflops is not None:
                self._peak_override = positive(peak_tflops)
            self._refresh_flops()
            self._send_run_record()

    def _emit(self, rec, tensors):
        """Sends rec now, or once its tensor values are on the host."""
        if tensors:
            from . import torch_utils
            self._pending.append(Pending(rec, torch_utils.LazyValues(tensors)))
        elif self._pending:
            self._pending.append(Pending(rec, None))
        else:
            self._finalize(rec, None)
        self._poll()

    def _poll(self, wait=False):
        while self._pending:
            p = self._pending[0]
            if p.lazy is not None and not (wait or p.lazy.ready()):
                return
            self._pending.popleft()
            self._finalize(p.rec, p.lazy)

    def _finalize(self, rec, lazy):
        if lazy is not None:
            try:
                for k, v in lazy.values().items():
                    place(rec, k, v)
            except Exception as e:
                self._link.warn_once("lazy", "deepseed: could not read tensor values: %s", e)
        link = self._link
        if rec.get("kind") == "step":
            derive_throughput(rec)
            if link.fpt and "tflops" not in rec:
                tf, mfu = flops.achieved(link.fpt, rec.get("tokens"), rec.get("step_ms"), link.peak)
                if tf is not None:
                    rec["tflops"] = tf
                    if mfu is not None and "mfu" not in rec:
                        rec["mfu"] = mfu
        link.send(rec)

    def _step_record(self, step, fields):
        rec = {"kind": "step", "run_id": self.run_id, "rank": self.rank, "step": int(step), "time": time.time()}
        plain, tensors = clean_fields(fields)
        for k, v in plain.items():
            place(rec, k, v)
        return rec, tensors

    def log_step(self, step=None, loss=None, lr=None, samples=None, tokens=None, grad_norm=None, **metrics):
        """Logs one training step. Values may be numbers or tensors; tensors
        are read once the device has produced them, never by synchronizing.
        With :meth:`watch`, the values join the timings of the step in flight
        or just finished, in one record."""
        try:
            fields = dict(metrics)
            fields.update(loss=loss, lr=lr, samples=samples, tokens=tokens, grad_norm=grad_norm)
            fields = {k: v for k, v in fields.items() if v is not None}
            if step is not None:
                step = int(step)
                if step < 0:
                    self._link.warn_once("negstep", "deepseed: negative step %d ignored", step)
                    return
            with self._lock:
                link = self._link
                w = link.watcher
                if w is not None and w.attach(step, fields):
                    return
                if step is None:
                    step = link.next_step
                link.next_step = step + 1
                self._wall_step_ms(step, fields)
                rec, tensors = self._step_record(step, fields)
                link.steps_logged += 1
                self._emit(rec, tensors)
        except Exception as e:
            self._link.warn_once("log_step", "deepseed: log_step: %s", e)

    def _wall_step_ms(self, step, fields):
        """Without watch(), a step's time is the wall clock since the
        previous log_step, shared evenly over the steps between them (a
        loop that logs every 10th step gets the mean of those 10). The
        first call has nothing to measure from; a step_ms passed in wins."""
        now = time.perf_counter()
        last, self._last_step_time = self._last_step_time, (step, now)
        if last is None or "step_ms" in fields:
            return
        last_step, last_t = last
        if step <= last_step:
            return
        fields["step_ms"] = (now - last_t) * 1000.0 / (step - last_step)

    def _emit_watched_step(self, step, fields, tensors, t=None, measured=None):
        """Called by the watcher with a finished step's measurements: plain
        numbers, read from the device already (tensors only from callers
        that pass them). t is when the step ended (epoch seconds); the
        record is built later, when its timings have been read back.
        measured holds fields the watcher made itself, already in the
        record's form; fields go through the checks after them."""
        rec = {"kind": "step", "run_id": self.run_id, "rank": self.rank, "step": int(step),
               "time": t if t is not None else time.time()}
        if measured:
            rec.update(measured)
        for k, v in fields.items():
            t = type(v)
            if t is not float and t is not int:
                if v is None:
                    continue
                if is_tensor(v):
                    tensors = dict(tensors or {}, **{k: v})
                    continue
                v = num(v)
                if v is None:
                    continue
            place(rec, k, v)
        self._link.steps_logged += 1
        self._emit(rec, tensors)

    def log_eval(self, step=None, loss=None, accuracy=None, f1=None, split="val", **metrics):
        """Logs an evaluation (loss, accuracy, F1 and any other metric)."""
        try:
            if step is None:
                step = max(0, self._link.next_step - 1)
            rec = {"kind": "eval", "run_id": self.run_id, "step": int(step), "time": time.time(),
                   "split": split or "val"}
            fields = dict(metrics)
            fields.update(loss=loss, accuracy=accuracy, f1=f1)
            plain, tensors = clean_fields(fields)
            for k, v in plain.items():
                place(rec, k, v)
            with self._lock:
                self._emit(rec, tensors)
        except Exception as e:
            self._link.warn_once("log_eval", "deepseed: log_eval: %s", e)

    def event(self, type, text="", step=None):
        """Records something that happened: checkpoint, overflow, restart,
        note…"""
        try:
            rec = {"kind": "event", "run_id": self.run_id, "time": time.time(), "type": str(type)[:256],
                   "rank": self.rank}
            if text:
                rec["text"] = str(text)[:65536]
            if step is not None:
                rec["step"] = int(step)
            with self._lock:
                self._emit(rec, None)
        except Exception as e:
            self._link.warn_once("event", "deepseed: event: %s", e)

    def log_memory(self, params=None, zero_stage=None, precision=None, world_size=None, offload_optimizer=None,
                   offload_params=None, activations_bytes=None, optimizer_bytes_per_param=None):
        """Sends the predicted per-GPU memory of parameters, gradients and
        optimizer state for this run's layout (arguments default to the
        run's meta). Returns the record."""
        try:
            m = self.meta
            n = params if params is not None else m.get("params")
            if n is None:
                return None
            pred = env.predict_memory(
                n,
                zero_stage=zero_stage if zero_stage is not None else m.get("zero_stage", 0),
                precision=precision or m.get("precision", "fp32"),
                world_size=world_size or m.get("world_size", 1),
                offload_optimizer=offload_optimizer or m.get("offload_optimizer", "none"),
                offload_params=offload_params or m.get("offload_params", "none"),
                optimizer_bytes_per_param=optimizer_bytes_per_param)
            rec = {"kind": "memory", "run_id": self.run_id, "rank": self.rank, "time": time.time()}
            rec.update(pred)
            if activations_bytes is not None:
                rec["activations_bytes"] = float(activations_bytes)
            if self.rank == 0:
                with self._lock:
                    self._emit(rec, None)
            return rec
        except Exception as e:
            self._link.warn_once("memory", "deepseed: log_memory: %s", e)
            return None

    # ---- torch ----------------------------------------------------------------

    def watch(self, model, optimizer=None, layers=None, layer_every=None, grad_norm="auto", batch_size=None,
              tokens_per_sample=None, flops_per_token=None, peak_tflops=None, **kwargs):
        """Measures every training step of model (a torch module or a
        DeepSpeed engine): forward, backward and optimizer time with CUDA
        events read back once complete, data-loading time, throughput,
        gradient norm, peak memory, and every layer_every steps the forward
        and backward time of each layer.

        Args:
            model: the module, or a DeepSpeed engine.
            optimizer: the torch optimizer; its step ends a step. Without it a
                step ends when the next training forward begins.
            layers: module names to profile, or None for transformer blocks,
                embeddings and head found automatically, or [] for none.
            layer_every: profile layers every N steps (0: never).
            grad_norm: "auto" (use what the framework computed, else one
                fused norm on the device), "fused", or "off".
            flops_per_token: training FLOPs per token, instead of the
                estimate from the model (see deepseed.flops).
            peak_tflops: the GPU's peak TFLOP/s for MFU, instead of the
                table's.
            phase_every, grad_norm_every, background_read: forward/backward/
                optimizer timing and gradient norm periods (10; phases every
                step in a distributed run), events read in batches as steps close
                (GPU; False: each step at the next one's open).
            scaler: the torch.amp.GradScaler of a mixed-precision loop (found
                on Accelerate's optimizer by itself): a step it skips for
                inf gradients is recorded as a skipped step of its own, and
                every step carries its loss scale.
            sample_min_ms: in a single process, phases and the gradient
                norm at their default periods also come no sooner than this
                after the previous one of their kind, layers no sooner than
                four times this (250, layers 1,000; 0: by period alone). A
                period set by argument or environment variable is kept
                exactly.
        """
        try:
            from .watch import Watcher
            link = self._link
            with self._lock:
                if flops_per_token is not None:
                    self._flops_override = positive(flops_per_token)
                if peak_tflops is not None:
                    self._peak_override = positive(peak_tflops)
                if link.watcher is not None:
                    link.watcher.close(wait=False)
                link.watcher = Watcher(link, model, optimizer=optimizer, layers=layers,
                                        layer_every=self.layer_every if layer_every is None else layer_every,
                                        layer_every_set=self.layer_every_set or layer_every is not None,
                                        grad_norm=grad_norm, batch_size=batch_size,
                                        tokens_per_sample=tokens_per_sample, **kwargs)
            return link.watcher
        except Exception as e:
            self._link.warn_once("watch", "deepseed: watch: %s", e)
            log.debug("watch failed", exc_info=True)
            return None

    # ---- end ------------------------------------------------------------------

    def summary(self):
        """Counts so far. records_sent is what the server or collector has
        acknowledged; records_pending what is still queued or in flight."""
        s = self._sender
        return {"steps": self.steps_logged, "duration_s": round(time.time() - self.started, 3),
                "records_sent": s.sent, "records_pending": s.pending, "records_dropped": s.dropped,
                "records_rejected": s.rejected, "records_saved_locally": s.saved}

    def finish(self, status="finished", summary=None, timeout=None):
        """Ends the run: reads what the device still owes, sends the end
        record and waits at most timeout seconds (default
        DEEPSEED_FLUSH_TIMEOUT, 5) for the records to leave."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
            self.status = status
        if self._watchdog is not None:
            self._watchdog.stop()
        budget = max(0.0, self.flush_timeout if timeout is None else timeout)
        flushed_at = None
        try:
            link = self._link
            if link.watcher is not None:
                try:
                    link.watcher.close(wait=True)
                except Exception as e:
                    self._link.warn_once("wclose", "deepseed: closing watcher: %s", e)
                # The watcher holds the model and optimizer; the run itself
                # stays reachable from the exit hooks, so let them go here or
                # every finished run of a process keeps its model's memory.
                link.watcher = None
            with self._lock:
                self._poll(wait=True)
            if self.rank == 0 or status != "finished":
                # Deliver everything before the end record so its counts are
                # what arrived, not what had left when finish() began. Half
                # the flush budget at most: the end record needs the rest.
                flushed_at = time.monotonic()
                getattr(self._sender, "drain", self._sender.flush)(budget / 2)
                summ = self.summary()
                if summary:
                    summ.update(summary)
                link.send({"kind": "end", "run_id": self.run_id, "time": time.time(), "status": status,
                           "summary": summ})
        except Exception as e:
            self._link.warn_once("finish", "deepseed: finish: %s", e)
        finally:
            spent = time.monotonic() - flushed_at if flushed_at is not None else 0.0
            self._sender.close(max(0.0, budget - spent))
            try:
                atexit.unregister(self._atexit)
            except Exception:
                pass
            global _current
            if _current is self:
                _current = None

    def _atexit(self):
        if not self.finished:
            self.finish("finished")

    def __enter__(self):
        return self

    def __exit__(self, tp, value, tb):
        if tp is None:
            self.finish("finished")
        elif issubclass(tp, KeyboardInterrupt):
            self.finish("killed", summary={"error": "KeyboardInterrupt"})
        else:
            self.finish("failed", summary={"error": ("%s: %s" % (tp.__name__, value))[:2000]})
        return False


def init(project=None, name=None, config=None, params=None, tags=None, run_id=None, sweep_id=None,
         collector_url=None, server_url=None, token=None, layer_every=None, **kwargs):
    """Starts a run and announces it. The options are
    :class:`~deepseed.options.RunOptions`'s.

    Records go to the node's collector (DEEPSEED_COLLECTOR_URL, default
    http://127.0.0.1:9464) or, when server_url or DEEPSEED_SERVER_URL is
    set, straight to the server with token (DEEPSEED_TOKEN).
    """
    global _current
    run = Run(project=project, name=name, config=config, params=params, tags=tags, run_id=run_id,
              sweep_id=sweep_id, collector_url=collector_url, server_url=server_url, token=token,
              layer_every=layer_every, **kwargs)
    _current = run
    return run
