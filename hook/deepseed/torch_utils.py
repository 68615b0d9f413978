"""Small torch helpers: values read from the device without synchronizing,
timers that are CUDA events on a GPU and host clocks elsewhere, and the
autograd engine's state (inside a backward or not; callbacks queued to a
backward's end). Imported only by a caller that already uses torch."""

from __future__ import annotations

import time

import torch


class HostEvent:
    """A CPU stand-in for torch.cuda.Event with the same three methods."""

    __slots__ = ("t",)

    def __init__(self):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0


try:
    _record_on = torch._C._CudaEventBase.record  # skips Event.record's stream lookup
    _stream_id = torch._C._cuda_getCurrentStream  # (stream id, device index, device type)
except AttributeError:  # pragma: no cover - a torch without CUDA
    _record_on = _stream_id = None


class EventPool:
    """Reuses timing events (creating one costs a driver call) and records
    them on the stream the watcher looked up once for the step, not on a
    stream looked up per event."""

    __slots__ = ("cuda", "_free", "stream", "_rec", "sid")

    def __init__(self, cuda):
        self.cuda = cuda
        self._free = []
        self.stream = None
        self.sid = None  # the stream's id: steps whose events share it complete in order
        self._rec = _record_on if cuda and _record_on is not None else None

    def get(self):
        if self._free:
            return self._free.pop()
        return torch.cuda.Event(enable_timing=True) if self.cuda else HostEvent()

    def put(self, ev):
        if ev is not None and len(self._free) < 4096:
            self._free.append(ev)

    def use_current_stream(self, device_index=None):
        """Looks the current stream up once; record() uses it until the
        next call."""
        if not self.cuda:
            return
        if _stream_id is not None and device_index is not None:
            # One C call; a Stream object only when the stream changed.
            sid = _stream_id(device_index)
            if sid == self.sid and self.stream is not None:
                return
            self.sid = sid
            self.stream = torch.cuda.current_stream(device_index)
            return
        self.stream = torch.cuda.current_stream(device_index)
        self.sid = getattr(self.stream, "cuda_stream", None)

    def record(self):
        ev = self._free.pop() if self._free else self.get()
        if self._rec is not None and self.stream is not None:
            self._rec(ev, self.stream)
        else:
            ev.record()
        return ev


class Box:
    """One scalar the device owes: value is None until its batch arrived."""

    __slots__ = ("value", "batch")

    def __init__(self, value=None):
        self.value = value
        self.batch = None

    def ready(self):
        b = self.batch
        if b is None:
            return self.value is not None
        return b.done or b.poll()


class _Batch:
    __slots__ = ("host", "ev", "boxes", "done")

    def __init__(self, host, ev, boxes):
        self.host = host
        self.ev = ev
        self.boxes = boxes
        self.done = False

    def poll(self, wait=False):
        if self.done:
            return True
        if self.ev is not None and not self.ev.query():
            if not wait:
                return False
            self.ev.synchronize()
        for b, v in zip(self.boxes, self.host.tolist()):
            b.value = v
        self.done = True
        return True


class Fetcher:
    """Scalar tensors read back in batches: values of many steps wait on
    the device and travel in one stack and one asynchronous copy to pinned
    memory, so that a step adds no kernel of its own for them. A batch
    leaves when it holds `size` values or its oldest is `max_age` seconds
    old; :meth:`Box.ready` then asks the copy's event whether it is done."""

    def __init__(self, size=32, max_age=0.25):
        self.size = size
        self.max_age = max_age
        # CUDA graph trees (mode="reduce-overhead") overwrite a graph's
        # outputs at its next replay: values are then copied as they come.
        self.copy_now = False
        self._t = []
        self._b = []
        self._since = 0.0

    def add(self, t):
        """A Box for tensor t (its mean when it has several elements)."""
        try:
            t = t.detach()
            if t.numel() != 1:
                t = t.float().mean()
            elif self.copy_now:
                t = t.clone()
            if not t.is_cuda:
                return Box(float(t.item()))
            box = Box()
            if not self._t:
                self._since = time.perf_counter()
            self._t.append(t)
            self._b.append(box)
            return box
        except Exception:
            return Box(float("nan"))

    @property
    def waiting(self):
        return len(self._t)

    def due(self, now):
        return bool(self._t) and (len(self._t) >= self.size or now - self._since >= self.max_age)

    def flush(self):
        if not self._t:
            return
        ts, boxes = self._t, self._b
        self._t, self._b = [], []
        try:
            vals = torch.stack([x.reshape(()) if x.dtype == torch.float32 else x.reshape(()).float() for x in ts])
            host = torch.empty(len(ts), dtype=torch.float32, pin_memory=True)
            host.copy_(vals, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            batch = _Batch(host, ev, boxes)
        except Exception as e:
            if "CUDAGraphs" in str(e):
                # A graph output read after the graph ran again: its value is
                # gone. Those steps carry no value; later ones are copied.
                self.copy_now = True
                _lost(boxes)
                return
            try:
                # Tensors on several devices: one at a time.
                host = torch.tensor([float(x.item()) for x in ts], dtype=torch.float32)
                batch = _Batch(host, None, boxes)
            except Exception:
                _lost(boxes)
                return
        for b in boxes:
            b.batch = batch


def _lost(boxes):
    # Values that cannot be read are missing (NaN), never a wrong number,
    # and never hold their steps back.
    for b in boxes:
        b.value = float("nan")
        b.batch = None


class LazyValues:
    """Scalar tensors copied to pinned host memory without waiting: one
    stack and one asynchronous copy for all device tensors, then
    :meth:`ready` asks the device whether the copy is done."""

    def __init__(self, tensors):
        self._plain = {}
        self._keys = []
        self._host = None
        self._ev = None
        dev = []
        for k, t in tensors.items():
            try:
                t = t.detach()
                if t.numel() != 1:
                    t = t.float().mean()
                t = t.reshape(())
                if t.is_cuda:
                    self._keys.append(k)
                    dev.append(t if t.dtype == torch.float32 else t.float())
                else:
                    self._plain[k] = t.item()
            except Exception:
                continue
        if dev:
            vals = torch.stack(dev) if len(dev) > 1 else dev[0].reshape(1)
            self._host = torch.empty(len(dev), dtype=torch.float32, pin_memory=True)
            self._host.copy_(vals, non_blocking=True)
            self._ev = torch.cuda.Event()
            self._ev.record()

    def ready(self):
        return self._ev is None or self._ev.query()

    def values(self):
        if self._ev is not None and not self._ev.query():
            self._ev.synchronize()  # only reached when the run is closing
        out = dict(self._plain)
        if self._host is not None:
            out.update(zip(self._keys, self._host.tolist()))
        return out


def fused_grad_norm(params):
    """The global L2 norm of the gradients of params as a device tensor:
    one multi-tensor norm per dtype, no host round trip."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    try:
        # The common case: one dtype, dense gradients: three launches.
        return _local(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))).float())
    except Exception:
        pass
    groups = {}
    for p in params:
        g = p.grad
        if g is not None:
            if g.is_sparse:
                g = g.coalesce()._values()
            groups.setdefault((g.device, g.dtype), []).append(g)
    if not groups:
        return None
    totals = []
    for gs in groups.values():
        norms = torch._foreach_norm(gs)
        totals.append(torch.linalg.vector_norm(torch.stack(norms)).float())
    if len(totals) == 1:
        return _local(totals[0])
    return _local(torch.linalg.vector_norm(torch.stack([_local(t).to(totals[0].device) for t in totals])))


def _local(t):
    # A norm of DTensor gradients (FSDP2) is this rank's part; make it a
    # plain tensor so that it can be read like the others.
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def iter_tensors(obj, depth=0):
    """Tensors inside an output: a tensor, tuple/list, dict, or a dataclass
    such as a Hugging Face ModelOutput."""
    if depth > 3:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from iter_tensors(o, depth + 1)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from iter_tensors(o, depth + 1)
    elif hasattr(obj, "__dataclass_fields__"):
        for k in obj.__dataclass_fields__:
            yield from iter_tensors(getattr(obj, k, None), depth + 1)


def first_grad_tensor(obj):
    for t in iter_tensors(obj):
        if t.requires_grad and t.grad_fn is not None:
            return t
    return None


def output_loss(out):
    """The loss inside a forward output, when the model computes it."""
    loss = None
    if isinstance(out, torch.Tensor):
        loss = out if out.dim() == 0 else None
    elif isinstance(out, dict):
        loss = out.get("loss")
    else:
        loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    return None


try:
    graph_task_id = torch._C._current_graph_task_id
except AttributeError:  # pragma: no cover - old torch
    graph_task_id = None

try:
    queue_callback = torch.autograd.Variable._execution_engine.queue_callback
except AttributeError:  # pragma: no cover
    queue_callback = None


def in_backward():
    """True inside an autograd backward pass (activation recomputation
    runs forwards there, which must not count as forward time)."""
    return graph_task_id is not None and graph_task_id() != -1


def peak_memory_gb(index):
    """Peak allocated and reserved GB of a device since the process began
    (or the last reset), from the allocator's nested statistics: the flat
    torch.cuda.memory_stats() costs a hundred Python calls more."""
    try:
        st = torch._C._cuda_memoryStats(index)
        return st["allocated_bytes"]["all"]["peak"] / 1e9, st["reserved_bytes"]["all"]["peak"] / 1e9
    except Exception:
        try:
            return (torch.cuda.max_memory_allocated(index) / 1e9, torch.cuda.max_memory_reserved(index) / 1e9)
        except Exception:
            return None


def torch_versions():
    v = {"torch": str(torch.__version__)}
    if torch.version.cuda:
        v["cuda"] = str(torch.version.cuda)
    return v
