"""Shared by the GPU check and benchmark: BERT-large from its config with
random weights, synthetic token batches, one bf16-autocast AdamW step."""

import os
import sys

HOOK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOOK)

import torch  # noqa: E402

# The seed's count for bert-large-uncased with a 2-label head. Built from
# BertConfig under transformers 5.17 the same model counts 335,143,938.
BERT_LARGE_PARAMS = 335141890


def bert_large(seed=0):
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                     intermediate_size=4096, max_position_embeddings=512, num_labels=2)
    cfg._name_or_path = "bert-large-uncased (random init)"
    model = BertForSequenceClassification(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, fused=True)
    return model, opt


def batches(n, batch, seq, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 30522, (batch, seq), device="cuda", generator=g)
        mask = torch.ones_like(ids)
        labels = torch.randint(0, 2, (batch,), device="cuda", generator=g)
        out.append((ids, mask, labels))
    return out


def train_step(model, opt, b):
    ids, mask, labels = b
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss


class CaptureProcess:
    """The capture server (tests/capture.py) in a process of its own, as the
    collector is in production: run in the benchmark's process, its decoding
    of every record would take the interpreter from the training thread and
    count against the hook. close() returns how many records arrived."""

    def __init__(self):
        import subprocess
        code = ("import sys; sys.path.insert(0, %r); from tests.capture import Capture; c = Capture(); "
                "print(c.url, flush=True); sys.stdin.read(); print(len(c.records()), flush=True)" % HOOK)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise RuntimeError("capture server did not start")

    def close(self):
        out, _ = self.proc.communicate("", timeout=60)
        return int(out.strip() or 0)
