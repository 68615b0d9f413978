"""Which modules of a model are the per-layer heatmap's rows, through the
torch stand-in of faketorch (whose children are numbered, as those of an
nn.Sequential or a DeepSpeed PipelineModule stage)."""

import os
import sys
import unittest

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

from . import faketorch  # noqa: E402


class SequenceRowsTest(unittest.TestCase):
    def setUp(self):
        self.addCleanup(faketorch.install())
        from deepseed import layers

        self.layers = layers
        base = sys.modules["torch"].nn.Module
        # A GPT built as a sequence: an embedding module holding the token
        # and position embeddings, the blocks, a head.
        self.Embed = type("Embed", (base,), {})
        self.Block = type("Block", (base,), {})
        self.Head = type("Head", (base,), {})

    def model(self, blocks, first=0):
        torch = sys.modules["torch"]
        kids = [self.Embed(children=[torch.nn.Module(), torch.nn.Module()])]
        kids += [self.Block(children=[torch.nn.Module()]) for _ in range(blocks)]
        kids.append(self.Head(children=[torch.nn.Module()]))
        return torch.nn.Module(children=kids)

    def test_a_sequence_gives_every_block_and_its_ends(self):
        rows = self.layers.find_layers(self.model(12))
        names = [n for n, _ in rows]
        self.assertEqual(names, ["Embed"] + ["Block.%d" % i for i in range(1, 13)] + ["Head"])
        # Each row is the child module itself, so its hooks time the block.
        self.assertIsInstance(rows[1][1], self.Block)


if __name__ == "__main__":
    unittest.main()
