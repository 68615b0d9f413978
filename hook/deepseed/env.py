"""What the hook learns about the process without importing a framework:
ranks from the launcher (and the run id its ranks share), host, command
line, git commit, package versions, and the run layout described by a
DeepSpeed config."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import shlex
import socket
import subprocess
import sys
import uuid


def _env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v is None or v == "":
            continue
        try:
            return int(v)
        except ValueError:
            continue
    return None


def is_set(name):
    """Whether environment variable name holds a value (not blank)."""
    v = os.environ.get(name)
    return v is not None and v.strip() != ""


def env_period(name, default):
    """A step period from environment variable name: its whole number, or
    default, with a warning, when it holds something else (a typo must not
    stop the training script nor switch the watcher off)."""
    if not is_set(name):
        return default
    v = os.environ[name]
    try:
        return int(v)
    except ValueError:
        logging.getLogger("deepseed").warning("deepseed: %s=%r is not a whole number; using %s", name, v, default)
        return default


def dist_info():
    """Returns (rank, local_rank, world_size).

    torch.distributed is asked only when torch is already imported and a
    process group exists; otherwise the launcher's environment answers
    (torchrun and the DeepSpeed launcher set RANK/LOCAL_RANK/WORLD_SIZE;
    Slurm and Open MPI have their own names)."""
    rank = _env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    local = _env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
    world = _env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            d = torch.distributed
            if d.is_available() and d.is_initialized():
                rank = d.get_rank()
                world = d.get_world_size()
        except Exception:
            pass
    rank = rank or 0
    world = world or 1
    if local is None:
        local = rank
    return rank, local, world


def shared_run_id(project, world_size):
    """A run id that every rank of one job agrees on: rank 0's, through a
    process group if one exists already, else one derived from the
    launcher's job id (with the project); a random one, with a warning
    when several ranks have neither."""
    torch = sys.modules.get("torch")
    if world_size > 1 and torch is not None:
        try:
            d = torch.distributed
            if d.is_available() and d.is_initialized():
                box = [uuid.uuid4().hex[:16] if d.get_rank() == 0 else None]
                d.broadcast_object_list(box, src=0)
                return box[0]
        except Exception:
            pass
    job = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID") or ""
    if job and job != "none":
        key = "%s/%s/%s/%s" % (job, os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""), project)
        return uuid.uuid5(uuid.NAMESPACE_URL, key).hex[:16]
    if world_size > 1 and os.environ.get("MASTER_PORT"):
        logging.getLogger("deepseed").warning(
            "deepseed: %d ranks and no shared run id; set DEEPSEED_RUN_ID or call "
            "deepseed.init() after torch.distributed.init_process_group()", world_size)
    return uuid.uuid4().hex[:16]


def host():
    try:
        return socket.gethostname()
    except Exception:
        return ""


def command():
    try:
        return shlex.join([sys.executable.rsplit("/", 1)[-1]] + list(sys.argv))
    except Exception:
        return ""


def git_commit(cwd=None):
    """HEAD of the git checkout holding cwd, or ""."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or os.getcwd(), capture_output=True,
                             text=True, timeout=2)
        if out.returncode == 0:
            return out.stdout.strip()
    except Exception:
        pass
    return ""


CODE_MAX_BYTES = 512 * 1024


def _cap_text(data, limit=CODE_MAX_BYTES):
    """(text, truncated): data (bytes) as UTF-8 text of at most limit
    bytes; a cut one ends with a note saying how much is shown. NUL, which
    no JSON text column stores, is dropped."""
    full = len(data)
    data = data.replace(b"\x00", b"")
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    note = "\n\n[deepseed: cut at %d of %d bytes]\n" % (limit, full)
    keep = data[:limit - len(note.encode()) - 8]
    text = keep.decode("utf-8", "ignore")  # a character split by the cut goes
    while len(text.encode("utf-8")) + len(note) > limit:  # replacement chars can grow the text
        text = text[:-64]
    return text + note, True


def entry_script():
    """Path of the script this process runs, or None (interactive, -c)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path and sys.argv and sys.argv[0] not in ("", "-c", "-m"):
        path = sys.argv[0]
    if path and os.path.isfile(path):
        return os.path.abspath(path)
    return None


def capture_code(limit=CODE_MAX_BYTES):
    """The entry script's source and `git diff HEAD` of the checkout that
    holds it (uncommitted changes, staged or not; untracked files are not
    in it), each at most limit bytes. None when there is neither."""
    code = {}
    path = entry_script()
    if path:
        try:
            with open(path, "rb") as f:
                data = f.read(limit * 4 + 1)
                size = os.fstat(f.fileno()).st_size
            text, cut = _cap_text(data, limit)
            code.update(entry_path=path, source=text, source_bytes=size)
            if cut:
                code["source_truncated"] = True
        except OSError:
            pass
    cwd = os.path.dirname(path) if path else os.getcwd()
    try:
        out = subprocess.run(["git", "diff", "HEAD", "--no-color", "--no-ext-diff"], cwd=cwd, capture_output=True,
                             timeout=5)
        if out.returncode == 0 and out.stdout:
            text, cut = _cap_text(out.stdout, limit)
            code.update(git_diff=text, git_diff_bytes=len(out.stdout))
            if cut:
                code["git_diff_truncated"] = True
    except Exception:
        pass
    return code or None


def _dist_version(name):
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:
        return None


def versions():
    """Package versions read from installed metadata, so that nothing is
    imported just to learn its version."""
    v = {"python": platform.python_version()}
    for key, dist in (("torch", "torch"), ("deepspeed", "deepspeed"), ("transformers", "transformers"),
                      ("lightning", "lightning"), ("pytorch_lightning", "pytorch-lightning")):
        ver = _dist_version(dist)
        if ver:
            v[key] = ver
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            v["torch"] = str(torch.__version__)
            if torch.version.cuda:
                v["cuda"] = str(torch.version.cuda)
        except Exception:
            pass
    from . import __version__
    v["deepseed"] = __version__
    return v


def load_config(config):
    """The DeepSpeed (or any) config as a dict: a dict is copied, a path to
    a JSON file is read, anything else becomes {"value": str(config)}."""
    if config is None:
        return None
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
        try:
            with open(config, encoding="utf-8") as f:
                v = json.load(f)
            return v if isinstance(v, dict) else {"value": v}
        except Exception:
            return {"path": str(config)}
    for attr in ("to_dict", "dict", "_asdict"):
        fn = getattr(config, attr, None)
        if callable(fn):
            try:
                v = fn()
                if isinstance(v, dict):
                    return v
            except Exception:
                pass
    if hasattr(config, "__dict__"):
        return {k: v for k, v in vars(config).items() if not k.startswith("_")}
    return {"value": str(config)}


def _enabled(section):
    if isinstance(section, dict):
        v = section.get("enabled", False)
        return v is True or (isinstance(v, str) and v.lower() == "true")
    return bool(section)


def _device(section):
    if isinstance(section, dict):
        d = section.get("device")
        if d in (None, "none"):
            return "none"
        return str(d)
    return "none"


def _int(v):
    try:
        if v is None or v == "auto":
            return None
        return int(v)
    except Exception:
        return None


def meta_from_ds_config(cfg, world_size=None):
    """Run meta implied by a DeepSpeed config: ZeRO stage, precision,
    offload, batch sizes. Fields the config does not state are left out."""
    if not isinstance(cfg, dict):
        return {}
    m = {}
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        st = _int(zero.get("stage"))
        if st is not None:
            m["zero_stage"] = st
        m["offload_optimizer"] = _device(zero.get("offload_optimizer"))
        m["offload_params"] = _device(zero.get("offload_param"))
    elif "zero_optimization" in cfg:
        m["zero_stage"] = 0
    if _enabled(cfg.get("bf16")) or _enabled(cfg.get("bfloat16")):
        m["precision"] = "bf16"
    elif _enabled(cfg.get("fp16")):
        m["precision"] = "fp16"
    elif any(k in cfg for k in ("fp16", "bf16", "zero_optimization", "train_micro_batch_size_per_gpu")):
        m["precision"] = "fp32"
    mb = _int(cfg.get("train_micro_batch_size_per_gpu"))
    ga = _int(cfg.get("gradient_accumulation_steps"))
    tb = _int(cfg.get("train_batch_size"))
    if mb is not None:
        m["micro_batch"] = mb
    if ga is not None:
        m["grad_accum"] = ga
    ws = world_size or 1
    if tb is not None:
        m["effective_batch"] = tb
    elif mb is not None:
        m["effective_batch"] = mb * (ga or 1) * ws
    pipe = cfg.get("pipeline")
    if isinstance(pipe, dict) and _int(pipe.get("stages")):
        m["pipeline_stages"] = _int(pipe.get("stages"))
    sched = cfg.get("scheduler")
    params = sched.get("params") if isinstance(sched, dict) else None
    total = total_steps(params.get("total_num_steps")) if isinstance(params, dict) else None
    if total is not None:
        m["total_steps"] = total
    if m:
        m["framework"] = "deepspeed"
    return m


def total_steps(v):
    """A run's total optimizer steps as a positive int, or None for
    anything else (unknown: -1, 0, infinity, a string like "auto")."""
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(f) or f < 1 or f > 2 ** 53 or f != int(f):
        return None
    return int(f)


def looks_like_ds_config(cfg):
    return isinstance(cfg, dict) and any(
        k in cfg for k in ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
                           "gradient_accumulation_steps", "fp16", "bf16"))


# Bytes per parameter of Adam's state: fp32 master copy, momentum and
# variance in mixed precision (the seed's and the ZeRO paper's K=12); with
# fp32 training the parameters are the master copy, leaving momentum and
# variance.
ADAM_BYTES_MIXED = 12
ADAM_BYTES_FP32 = 8


def predict_memory(params, zero_stage=0, precision="fp32", world_size=1, offload_optimizer="none",
                   offload_params="none", optimizer_bytes_per_param=None):
    """Predicted bytes per GPU of parameters, gradients and optimizer state.

    ZeRO-1 shards optimizer state, ZeRO-2 also gradients, ZeRO-3 also
    parameters, each over world_size ranks. Offloaded state is reported
    with its device (cpu or nvme) instead of gpu.
    """
    n = int(params)
    ws = max(1, int(world_size or 1))
    st = int(zero_stage or 0)
    half = str(precision).lower() in ("fp16", "bf16", "float16", "bfloat16", "half", "16", "16-mixed", "bf16-mixed")
    pb = 2 if half else 4
    ob = optimizer_bytes_per_param
    if ob is None:
        ob = ADAM_BYTES_MIXED if half else ADAM_BYTES_FP32
    p = n * pb
    g = n * pb
    o = n * ob
    if st >= 1:
        o /= ws
    if st >= 2:
        g /= ws
    if st >= 3:
        p /= ws
    odev = offload_optimizer if offload_optimizer in ("cpu", "nvme") else "gpu"
    pdev = offload_params if (offload_params in ("cpu", "nvme") and st >= 3) else "gpu"
    return {
        "parameters_bytes": float(p),
        "gradients_bytes": float(g),
        "optimizer_bytes": float(o),
        "optimizer_device": odev,
        "parameters_device": pdev,
    }


def job_ids():
    """The job a DeepSeed agent started this process for (DEEPSEED_JOB_ID),
    as meta: the server links the run to its job. The sweep
    (DEEPSEED_SWEEP_ID) and run id (DEEPSEED_RUN_ID) are read with the
    run's other fields."""
    v = (os.environ.get("DEEPSEED_JOB_ID") or "").strip()
    return {"job_id": v} if v else {}


def job_params():
    """A job's parameters as the agent gives them (DEEPSEED_PARAMS, a JSON
    object), or None."""
    raw = os.environ.get("DEEPSEED_PARAMS")
    if not raw:
        return None
    try:
        v = json.loads(raw)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def lightning_precision(trainer_precision):
    """bf16 / fp16 / fp32 from Lightning's precision setting ("bf16-mixed",
    "16-mixed", "32-true", 16, …); None when it names none of them."""
    p = str(trainer_precision if trainer_precision is not None else "").lower()
    if "bf16" in p:
        return "bf16"
    if p.startswith("16") or "fp16" in p or p == "half":
        return "fp16"
    if p.startswith(("32", "64")) or "fp32" in p:
        return "fp32"
    return None


def strategy_parallelism(strategy_name):
    """The run's parallelism from a Lightning strategy's class name."""
    s = strategy_name or ""
    if "FSDP" in s:
        return "fsdp"
    if "DeepSpeed" in s:
        return "deepspeed"
    if "DDP" in s or "DataParallel" in s:
        return "ddp"
    return None
