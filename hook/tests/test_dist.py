"""torch.distributed integration without torch: parameter counts and
gradient-norm handling under FSDP's flattened, sharded parameters (duck
typed fakes carry the attributes FSDP sets), and runs one after another in
one process."""

import gc
import os
import subprocess
import sys
import textwrap
import time
import unittest
import weakref

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import deepseed  # noqa: E402
from deepseed.integrations.torch_dist import describe, grads_sharded, param_count  # noqa: E402

from .capture import Capture  # noqa: E402


class Tensor:
    def __init__(self, n, **attrs):
        self.n = n
        self.__dict__.update(attrs)

    def numel(self):
        return self.n


class Module:
    def __init__(self, params=(), children=(), **attrs):
        self._params = list(params)
        self._children = list(children)
        self.__dict__.update(attrs)

    def modules(self):
        yield self
        for c in self._children:
            yield from c.modules()

    def parameters(self):
        for m in self.modules():
            yield from m._params


class Handle:
    def __init__(self, flat_param):
        self.flat_param = flat_param


class FullyShardedDataParallel(Module):
    pass


class ParamCountTest(unittest.TestCase):
    # A model of 1,000 + 2 x 300 parameters, two ranks.

    def test_plain_and_deepspeed(self):
        m = Module([Tensor(1000)], [Module([Tensor(300)]), Module([Tensor(0, ds_numel=300)])])
        self.assertEqual(param_count(m), 1600)

    def test_fsdp_flat_parameters_count_full_size(self):
        # use_orig_params=False: each unit's FlatParameter holds this rank's
        # half (plus padding); numel() would give about half the model.
        def flat(numels):
            return Tensor((sum(numels) + 1) // 2, _is_flat_param=True, _fsdp_flattened=True, _numels=numels)
        blocks = [FullyShardedDataParallel([flat((200, 100))]) for _ in range(2)]
        root_fp = flat((1000,))
        root = FullyShardedDataParallel([root_fp], blocks, _handle=Handle(root_fp))
        self.assertEqual(param_count(root), 1600)
        self.assertLess(sum(p.numel() for p in root.parameters()), 1000)

    def test_fsdp_use_orig_params_counts_handles_not_views(self):
        # use_orig_params=True: originals are shard views, the FlatParameter
        # is reachable through the unit's handle only.
        views = [Tensor(150, _fsdp_flattened=True), Tensor(0, _fsdp_flattened=True)]
        fp = Tensor(300, _is_flat_param=True, _numels=(200, 100))
        root = FullyShardedDataParallel(views, [], _handle=Handle(fp))
        self.assertEqual(param_count(root), 300)

    def test_padding_size_when_numels_missing(self):
        fp = Tensor(5, _is_flat_param=True, _unpadded_unsharded_size=(9,))
        self.assertEqual(param_count(Module([fp])), 9)


class GradNormShardingTest(unittest.TestCase):
    def test_sharded_strategies_only(self):
        for strategy, sharded in (("NO_SHARD", False), ("SHARD_GRAD_OP", True), ("FULL_SHARD", True)):
            m = FullyShardedDataParallel(sharding_strategy=Tensor(0, name=strategy))
            self.assertEqual(grads_sharded(describe(m)), sharded, strategy)

    def test_ddp_and_zero1_are_not_sharded(self):
        class DistributedDataParallel(Module):
            pass

        class ZeroRedundancyOptimizer:
            pass
        self.assertFalse(grads_sharded(describe(DistributedDataParallel())))
        meta = describe(DistributedDataParallel(), ZeroRedundancyOptimizer())
        self.assertEqual(meta["zero_stage"], 1)
        self.assertFalse(grads_sharded(meta))


class SequentialRunsTest(unittest.TestCase):
    def test_finished_run_lets_go_of_what_it_watched(self):
        cap = Capture()
        try:
            run = deepseed.init(project="t", collector_url=cap.url, flush_interval=0.05, handle_signals=False)

            class Watched:
                def close(self, wait=True):
                    pass
            w = Watched()
            ref = weakref.ref(w)
            run._link.watcher = w
            del w
            run.finish()
            gc.collect()
            self.assertIsNone(ref(), "a finished run still holds its watcher (and so the model)")
        finally:
            cap.close()

    def test_sigterm_ends_the_current_of_several_runs(self):
        cap = Capture()
        try:
            code = textwrap.dedent("""
                import sys, time
                sys.path.insert(0, %r)
                import deepseed
                first = deepseed.init(project="t", name="a", collector_url=%r, flush_interval=0.05)
                first.finish()
                second = deepseed.init(project="t", name="b", collector_url=%r, flush_interval=0.05)
                print(first.run_id, second.run_id, flush=True)
                time.sleep(60)
            """ % (HOOK, cap.url, cap.url))
            p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            ids = p.stdout.readline().split()
            self.assertEqual(len(ids), 2)
            p.terminate()
            p.wait(30)
            p.stdout.close()
            deadline = time.monotonic() + 5
            while len(cap.records("end")) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            ends = {e["run_id"]: e["status"] for e in cap.records("end")}
            self.assertEqual(ends, {ids[0]: "finished", ids[1]: "killed"})
        finally:
            cap.close()


if __name__ == "__main__":
    unittest.main()
