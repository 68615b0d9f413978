"""A stand-in for the few parts of torch that the watcher touches on a
CPU-only process, so that the watcher's step logic runs here without
torch: scalar tensors with backward hooks, modules with forward hooks.
Timings then come from the host clock (torch_utils.HostEvent), as they do
for a model on the CPU.

install() puts it in sys.modules as ``torch`` and returns a function that
takes it out again, with the hook modules that imported it."""

import sys
import types


class Tensor:
    """A scalar or a batch of a given shape; value is what item() reads."""

    def __init__(self, value=0.0, shape=(), requires_grad=False, dtype="float32"):
        self.value = float(value)
        self.shape = tuple(shape)
        self.requires_grad = requires_grad
        self.grad_fn = object() if requires_grad else None
        self.dtype = dtype
        self.is_cuda = False
        self.is_sparse = False
        self.grad = None
        self.hooks = []

    def detach(self):
        return Tensor(self.value, self.shape, dtype=self.dtype)

    def clone(self):
        return Tensor(self.value, self.shape, requires_grad=self.requires_grad, dtype=self.dtype)

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def dim(self):
        return len(self.shape)

    def float(self):
        return Tensor(self.value, self.shape, self.requires_grad)

    def mean(self):
        return Tensor(self.value)

    def reshape(self, *shape):
        return self

    def item(self):
        return self.value

    def is_floating_point(self):
        return self.dtype in ("float32", "float16", "bfloat16")

    def register_hook(self, fn):
        self.hooks.append(fn)

    def backward_reached(self):
        """What autograd does when the gradient reaches this tensor."""
        for fn in self.hooks:
            fn(None)


Tensor.__module__ = "torch"


class _Handle:
    def __init__(self, hooks, fn):
        self.hooks, self.fn = hooks, fn

    def remove(self):
        if self.fn in self.hooks:
            self.hooks.remove(self.fn)


class Module:
    """A module with forward hooks, one parameter and named submodules."""

    def __init__(self, forward=None, children=()):
        self.training = True
        self._forward = forward
        self._children = list(children)
        self._param = Tensor(0.0, (4, 4), requires_grad=True)
        self._param.device = types.SimpleNamespace(type="cpu", index=None)
        self._pre, self._post = [], []

    def parameters(self):
        yield self._param
        for c in self._children:
            yield from c.parameters()

    def named_parameters(self):
        for i, p in enumerate(self.parameters()):
            yield "p%d" % i, p

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_modules(self, prefix=""):
        yield prefix, self
        for i, c in enumerate(self._children):
            yield from c.named_modules("%s%d" % (prefix + "." if prefix else "", i))

    def train(self, mode=True):
        self.training = mode
        return self

    def register_forward_pre_hook(self, fn, with_kwargs=False, prepend=False):
        self._pre.insert(0 if prepend else len(self._pre), fn)
        return _Handle(self._pre, fn)

    def register_forward_hook(self, fn):
        self._post.append(fn)
        return _Handle(self._post, fn)

    def __call__(self, *args, **kwargs):
        for fn in list(self._pre):
            fn(self, args, kwargs)
        out = self._forward(*args, **kwargs)
        for fn in list(self._post):
            fn(self, args, out)
        return out


class Optimizer:
    """An optimizer with step hooks and one parameter group."""

    def __init__(self, params=(), lr=0.01):
        self.param_groups = [{"params": list(params), "lr": lr}]
        self._pre, self._post = [], []

    def register_step_pre_hook(self, fn):
        self._pre.append(fn)
        return _Handle(self._pre, fn)

    def register_step_post_hook(self, fn):
        self._post.append(fn)
        return _Handle(self._post, fn)

    def step(self):
        for fn in list(self._pre):
            fn(self, (), {})
        for fn in list(self._post):
            fn(self, (), {})


def _stack(ts):
    return Tensor(sum(t.value for t in ts) / max(1, len(ts)), (len(ts),))


def _module():
    m = types.ModuleType("torch")
    m.__version__ = "0.0-fake"
    m.Tensor = Tensor
    m.float16, m.bfloat16, m.float32 = "float16", "bfloat16", "float32"
    m.nn = types.SimpleNamespace(Module=Module, ModuleList=type("ModuleList", (list,), {}))
    m.optim = types.SimpleNamespace(Optimizer=Optimizer)
    m.cuda = types.SimpleNamespace(is_available=lambda: False)
    m.version = types.SimpleNamespace(cuda=None)
    m.is_grad_enabled = lambda: True
    m.stack = _stack
    m.distributed = types.SimpleNamespace(is_available=lambda: False, is_initialized=lambda: False)
    return m


# The hook's modules that import torch at their top: each is imported
# afresh against the fake, and taken out again by the undo function.
TORCH_MODULES = ("watch", "layers", "phases", "readback", "torch_utils", "comm")


def install():
    """Makes ``import torch`` give the fake; returns the undo function."""
    names = tuple("deepseed." + m for m in TORCH_MODULES)
    saved = {k: sys.modules.get(k) for k in ("torch",) + names}
    for k in names:
        sys.modules.pop(k, None)
    sys.modules["torch"] = _module()

    def undo():
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        pkg = sys.modules.get("deepseed")
        for attr in TORCH_MODULES:
            if pkg is not None and saved.get("deepseed." + attr) is None and hasattr(pkg, attr):
                delattr(pkg, attr)

    return undo
