"""Model FLOPs per token and the dense peak of common GPUs, for TFLOP/s and
MFU per step. Standard library only.

FLOPs per token of training (forward and backward), after Kaplan et al.
and the PaLM paper's MFU appendix:

    6 * N                       every parameter: 2 FLOPs forward (multiply
                                and add), 4 backward (gradients of inputs
                                and of weights)
  + 12 * L * d_model * seq_len  attention scores and their weighted sum
                                (QK^T and AV: 2 * 2 * seq_len * d_model per
                                layer forward, three times that with
                                backward), for transformer configs the hook
                                recognises and a known sequence length

N counts every parameter the watched model has (embeddings included).
Activation recomputation is not counted: MFU measures the model's
FLOPs, not the hardware's.
"""

import re

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim")

# Dense (no sparsity) peak TFLOP/s per GPU from the vendor datasheets, by
# precision. tf32 is the tensor-core rate for fp32 matmuls with TF32 on.
# Matched in order against torch.cuda.get_device_name().
PEAK_TFLOPS = (
    (r"H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100.*PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5 (HBM3)
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    (r"\bA10\b(?!0|G)", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"\bT4\b", {"fp16": 65.0, "fp32": 8.1}),  # Turing: no bf16 or tf32 tensor cores
)


def _get(cfg, keys):
    for k in keys:
        v = cfg.get(k) if isinstance(cfg, dict) else getattr(cfg, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def transformer_shape(cfg):
    """(layers, d_model) of a Hugging Face style config (an object or a
    dict), or None when it names neither."""
    if cfg is None:
        return None
    if not isinstance(cfg, dict) and hasattr(cfg, "to_dict"):
        try:
            cfg = cfg.to_dict()
        except Exception:
            pass
    # Encoder-decoder configs (T5) count both stacks.
    layers = _get(cfg, LAYER_KEYS)
    dec = _get(cfg, ("num_decoder_layers",))
    width = _get(cfg, WIDTH_KEYS)
    if layers is None or width is None:
        return None
    if dec and dec != layers and _get(cfg, ("num_layers",)) == layers:
        layers += dec
    return layers, width


def flops_per_token(params, cfg=None, seq_len=None):
    """Training FLOPs per token: 6 * params, plus the attention term when
    cfg is a recognised transformer config and seq_len is known."""
    if not params or params <= 0:
        return None
    total = 6.0 * params
    shape = transformer_shape(cfg)
    if shape and seq_len and seq_len > 0:
        layers, width = shape
        total += 12.0 * layers * width * seq_len
    return total


def peak_tflops(gpu_name, precision):
    """The dense peak TFLOP/s of a GPU for a precision (bf16, fp16, tf32,
    fp32), or None when the GPU or the precision is not in the table."""
    if not gpu_name:
        return None
    prec = (precision or "fp32").lower()
    for pat, peaks in PEAK_TFLOPS:
        if re.search(pat, gpu_name):
            return peaks.get(prec)
    return None


def achieved(flops_token, tokens, step_ms, peak=None):
    """(TFLOP/s, MFU) of one rank's step: flops_token * tokens / step time.
    tokens are the rank's own (a step record's tokens), so the result is
    per GPU. MFU is a fraction of peak (0..1], None without a peak; both are
    None where MFU would pass 1."""
    if not flops_token or not tokens or not step_ms or not (step_ms > 0):
        return None, None
    tflops = flops_token * tokens / (step_ms / 1000.0) / 1e12
    mfu = tflops / peak if peak and peak > 0 else None
    if mfu is not None and mfu > 1.0:
        # More than the GPU can do: the FLOPs per token, the tokens or the
        # step is not what the step ran (micro-steps counted as steps, a
        # wrong precision's peak). No number beats a wrong one.
        return None, None
    return tflops, mfu
