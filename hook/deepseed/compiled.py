"""The hook beside torch.compile: what it may run where dynamo traces, and
where it hooks a compiled model instead.

Dynamo traces a module's hooks with its forward: a hook that reads the
clock, takes a lock or records an event there breaks the graph, and one
that is added and removed (the layer profiler's, every few steps) changes
what dynamo guards on and recompiles the frame until its limit, after
which the model runs eagerly. So:

1. Every hook the watcher registers starts with ``if compiling(): return``:
   traced, it is empty (dynamo folds the test to a constant), and it adds
   no graph break, no guard and no recompilation.
2. The hooks that open, time and close a step go where the host runs them
   eagerly: on the module ``torch.compile`` returned (an
   ``OptimizedModule`` runs its own hooks outside the graph), or around
   the compiled call of a module compiled in place (``module.compile()``),
   see :func:`wrap_compiled_call`.
3. A model compiled after ``watch()`` is found at its first optimizer
   step (the step's forward ran and no hook saw it): :func:`find_wrapper`
   looks up the module that compiles it, and the hooks move there.
4. What runs inside a compiled graph cannot be timed from the host: the
   layers of a model compiled whole have no per-layer times, and the run
   says so (``layer_times`` in its metadata) instead of sending zeros.
   Blocks compiled one by one (``block.compile()``, as torchtitan does) are
   timed around their compiled calls.
"""

from __future__ import annotations

import gc

import torch

try:
    compiling = torch.compiler.is_compiling
except AttributeError:  # pragma: no cover - torch < 2.3
    try:
        compiling = torch._dynamo.is_compiling
    except AttributeError:
        def compiling():
            return False

# What a run's layer_times metadata says when its layers cannot be timed.
WHOLE_MODEL = ("unavailable: the model is compiled whole (torch.compile), so its layers run inside one graph; "
               "compile each block instead (block.compile()) to time them")


def is_wrapper(module):
    """True for the module torch.compile(m) returns."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def compiled_in_place(module):
    """True for a module compiled with module.compile()."""
    return getattr(module, "__dict__", {}).get("_compiled_call_impl") is not None


def unwrap(module):
    """The module a torch.compile wrapper holds (module itself otherwise)."""
    while is_wrapper(module):
        module = module._orig_mod
    return module


def find_wrapper(module):
    """The OptimizedModule that compiles module, or None. Searched once,
    when a watched model's forward ran without its hooks: the wrapper holds
    module in its _modules dict, which its instance dict holds (up to three
    referrers away)."""
    try:
        level, seen = [module], set()
        for _ in range(3):
            nxt = []
            for obj in level:
                for ref in gc.get_referrers(obj):
                    if id(ref) in seen:
                        continue
                    seen.add(id(ref))
                    if is_wrapper(ref) and ref._modules.get("_orig_mod") is module:
                        return ref
                    if isinstance(ref, dict) and len(nxt) < 64:
                        nxt.append(ref)
            level = nxt
    except Exception:
        return None
    return None


class CompiledCall:
    """Replaces a module's compiled call (module.compile()) with one that
    runs pre(module, args, kwargs) and post(module, args, out) on the host
    around it; restore() puts the compiled call back."""

    def __init__(self, module, pre, post):
        self.module = module
        self.orig = module.__dict__["_compiled_call_impl"]
        self.pre = pre
        self.post = post
        orig = self.orig

        def call(*args, **kwargs):
            if compiling():
                return orig(*args, **kwargs)
            pre(module, args, kwargs)
            out = orig(*args, **kwargs)
            post(module, args, out)
            return out

        call.deepseed_wrapped = True
        module._compiled_call_impl = call

    def restore(self):
        cur = self.module.__dict__.get("_compiled_call_impl")
        if getattr(cur, "deepseed_wrapped", False):
            self.module._compiled_call_impl = self.orig


def wrap_compiled_call(module, pre, post):
    """A :class:`CompiledCall` around module's compiled call, or None when
    module is not compiled in place (or already wrapped)."""
    cur = getattr(module, "__dict__", {}).get("_compiled_call_impl")
    if cur is None or getattr(cur, "deepseed_wrapped", False):
        return None
    return CompiledCall(module, pre, post)


def cudagraphs_in_use(device_index):
    """True once inductor's CUDA graph trees (mode="reduce-overhead") run on
    the device: their outputs are overwritten by the next replay, so a value
    read later must be copied first."""
    import sys
    mod = sys.modules.get("torch._inductor.cudagraph_trees")
    if mod is None or device_index is None:
        return False
    try:
        return mod.get_manager(device_index, False) is not None
    except Exception:
        return False
