"""The layer profiler: which modules of a model are its rows (embeddings,
each transformer block, head), and the forward and backward time of each
during the steps it is armed for (every ``layer_every`` steps). Its events
go with the step's and are read back with them (readback.py)."""

from __future__ import annotations

import collections

import torch

from .compiled import compiled_in_place, compiling, wrap_compiled_call
from .torch_utils import first_grad_tensor, in_backward

_Tensor = torch.Tensor


def _grad_input(args):
    # The common case first: the block's input is its first argument.
    a = args[0] if args else None
    if type(a) is _Tensor and a.requires_grad and a.grad_fn is not None:
        return a
    return first_grad_tensor(args)

BLOCK_LIST_NAMES = {"layer", "layers", "h", "block", "blocks", "encoder_layers", "decoder_layers"}
ENC_DEC_NAMES = {"encoder", "decoder"}
EMBED_NAMES = {"embeddings", "embedding", "embed", "wte", "wpe", "embed_tokens", "tok_embeddings", "word_embeddings",
               "embed_positions", "patch_embed"}
HEAD_NAMES = {"classifier", "lm_head", "head", "score", "qa_outputs", "cls", "output_layer", "heads"}
WRAPPER_PARTS = {"module", "_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"}


def clean_name(name):
    return ".".join(p for p in name.split(".") if p not in WRAPPER_PARTS)


def find_layers(model):
    """(row name, module) pairs in model order: embeddings, each
    transformer block, head. BERT-large gives the seed's 26 rows:
    embeddings, encoder.0 … encoder.23, classifier."""
    named = list(model.named_modules())
    lists = []
    for name, m in named:
        if not isinstance(m, torch.nn.ModuleList) or len(m) < 2 or len({type(c) for c in m}) != 1:
            continue
        parts = clean_name(name).split(".")
        last = parts[-1]
        parent = parts[-2] if len(parts) > 1 else ""
        if last in BLOCK_LIST_NAMES or parent in ENC_DEC_NAMES:
            if not any(name.startswith(n + ".") for n, _ in lists):
                lists.append((name, m))
    if not lists:
        best = None
        for name, m in named:
            if isinstance(m, torch.nn.ModuleList) and len(m) >= 2 and len({type(c) for c in m}) == 1:
                n = sum(p.numel() for p in m.parameters())
                if best is None or n > best[0]:
                    best = (n, name, m)
        if best is not None:
            lists.append((best[1], best[2]))
    if not lists:
        rows = _sequence_rows(named)
        if rows:
            return rows
    list_names = {n for n, _ in lists}
    chosen = []
    rows = []

    def inside(name):
        return any(name.startswith(c + ".") for c in chosen)

    for name, m in named:
        if not name or inside(name):
            continue
        parts = clean_name(name).split(".")
        last = parts[-1] if parts else ""
        if name in list_names:
            parent = parts[-2] if len(parts) > 1 else ""
            prefix = parent if (last in BLOCK_LIST_NAMES and parent in ENC_DEC_NAMES) else last
            for i, c in enumerate(m):
                rows.append(["%s.%d" % (prefix, i), c, clean_name(name) + ".%d" % i])
            chosen.append(name)
        elif last in EMBED_NAMES or (isinstance(m, torch.nn.Embedding) and not rows):
            rows.append([last, m, clean_name(name)])
            chosen.append(name)
        elif last in HEAD_NAMES and rows:
            rows.append([last, m, clean_name(name)])
            chosen.append(name)
    seen = collections.Counter(r[0] for r in rows)
    return [(r[2] if seen[r[0]] > 1 else r[0], r[1]) for r in rows]


def _sequence_rows(named):
    """The rows of a model built as a sequence of modules (nn.Sequential,
    a DeepSpeed PipelineModule stage): the children of the container whose
    children are numbered and include a run of one type, each child a row,
    in order: "Embed", "Block.1" … "Block.12", "Head". None when the model
    has no such container. Without it, a sequence of an embedding module,
    blocks and a head would give only the embedding's first nn.Embedding."""
    kids = collections.defaultdict(list)
    for name, m in named:
        if not name:
            continue
        parent, _, key = name.rpartition(".")
        if key.isdigit():
            kids[parent].append((name, key, m))
    best = None
    for parent, children in kids.items():
        types = collections.Counter(type(m) for _, _, m in children)
        block, n = types.most_common(1)[0]
        if n < 2:
            continue
        size = sum(p.numel() for _, _, m in children if type(m) is block for p in m.parameters())
        if best is None or size > best[0]:
            best = (size, block, children)
    if best is None:
        return None
    _, block, children = best
    rows = []
    for name, key, m in children:
        label = "%s.%s" % (block.__name__, key) if type(m) is block else type(m).__name__
        rows.append([label, m, clean_name(name)])
    seen = collections.Counter(r[0] for r in rows)
    return [(r[2] if seen[r[0]] > 1 else r[0], r[1]) for r in rows]


class LayerProfiler:
    """Forward and backward time of chosen modules during armed steps.

    A module's hooks are registered when a step arms the profiler and
    removed when it disarms; a module compiled in place (block.compile())
    is timed instead around its compiled call, by a wrapper put in once
    (adding and removing hooks there would recompile it, compiled.py)."""

    def __init__(self, pool, rows):
        self.pool = pool  # the watcher's EventPool
        self.names = [n for n, _ in rows]
        self.modules = [m for _, m in rows]
        self.handles = []
        self.cur = None  # per-row {"fwd": [[a,b]], "bstart": [...], "bend": [...]}
        # The hooks are made once; arming only registers them.
        self._fns = [(self._pre(i), self._post(i)) for i in range(len(self.modules))]
        # A module whose inputs need no gradient (embeddings) ends its
        # backward when its last parameter gradient is accumulated.
        self._params = [[p for p in m.parameters() if p.requires_grad] for m in self.modules]
        self.calls = {}  # module index: its CompiledCall

    def _hook_compiled(self, i, m):
        if i not in self.calls:
            pre, post = self._fns[i]
            call = wrap_compiled_call(m, lambda mod, a, k: self.cur is not None and pre.timed(mod, a, k),
                                      lambda mod, a, o: self.cur is not None and post.timed(mod, a, o))
            if call is None:
                return False
            self.calls[i] = call
        return True

    def restore(self):
        """Puts the compiled calls it wrapped back (the watcher's close)."""
        for call in self.calls.values():
            call.restore()
        self.calls = {}

    def arm(self):
        self.cur = [{"fwd": [], "bstart": [], "bend": [], "params": ps} for ps in self._params]
        add = self.handles.append
        for i, (m, (pre, post)) in enumerate(zip(self.modules, self._fns)):
            if compiled_in_place(m) and self._hook_compiled(i, m):
                continue
            add(m.register_forward_pre_hook(pre, with_kwargs=True))
            add(m.register_forward_hook(post))
        return self.cur

    def disarm(self):
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles = []
        cur, self.cur = self.cur, None
        return cur

    def _pre(self, i):
        def hook(module, args, kwargs):
            if compiling():
                return
            timed(module, args, kwargs)

        def timed(module, args, kwargs):
            if in_backward() or not torch.is_grad_enabled():
                return
            row = self.cur[i]
            row["fwd"].append([self.pool.record(), None])
            inp = _grad_input(args)
            if inp is None and kwargs:
                inp = first_grad_tensor(kwargs.get("hidden_states"))
            if inp is not None:
                inp.register_hook(self._bwd_end(i))
            elif row.get("params") and not row.get("phooked"):
                row["phooked"] = True
                for p in row["params"]:
                    if hasattr(p, "register_post_accumulate_grad_hook"):
                        self.handles.append(p.register_post_accumulate_grad_hook(self._param_end(i)))
            elif not row.get("params"):
                # No input gradient and no parameters of its own: FSDP
                # replaces them by views of its flat parameter. The backward
                # then ends when the node that made the output has run.
                row["fnend"] = True
        hook.timed = timed
        return hook

    def _post(self, i):
        def hook(module, args, out):
            if compiling():
                return
            timed(module, args, out)

        def timed(module, args, out):
            if in_backward() or not torch.is_grad_enabled():
                return
            row = self.cur[i]
            if row["fwd"] and row["fwd"][-1][1] is None:
                row["fwd"][-1][1] = self.pool.record()
            t = out if type(out) is _Tensor and out.requires_grad and out.grad_fn is not None else None
            if t is None:
                t = first_grad_tensor(out)
            if t is not None:
                t.register_hook(self._bwd_start(i))
                if row.get("fnend") and t.grad_fn is not None:
                    t.grad_fn.register_hook(self._fn_end(i))
        hook.timed = timed
        return hook

    def _fn_end(self, i):
        def hook(grad_inputs, grad_outputs):
            if not compiling() and self.cur is not None:
                self.cur[i]["bend"].append(self.pool.record())
        return hook

    def _bwd_start(self, i):
        def hook(grad):
            if not compiling() and self.cur is not None:
                self.cur[i]["bstart"].append(self.pool.record())
        return hook

    def _bwd_end(self, i):
        def hook(grad):
            if not compiling() and self.cur is not None:
                self.cur[i]["bend"].append(self.pool.record())
        return hook

    def _param_end(self, i):
        def hook(p):
            if compiling() or self.cur is None:
                return
            row = self.cur[i]
            # One end per backward: later parameters of the same pass move it.
            n = len(row["bstart"])
            if len(row["bend"]) < n:
                row["bend"].append(self.pool.record())
            elif row["bend"]:
                row["bend"][-1].record()
        return hook


def events_of(layer):
    for row in layer or ():
        for a, b in row["fwd"]:
            yield a
            if b is not None:
                yield b
        yield from row["bstart"]
        yield from row["bend"]
