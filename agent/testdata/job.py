"""A training job for the agent's tests: it uses the hook (the agent's
environment names the run, job and sweep) and behaves as argv[1] says."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "hook"))
import deepseed  # noqa: E402

mode = sys.argv[1]
gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
locks = []
if os.environ.get("DEEPSEED_PARAM_LOCKDIR"):
    # A GPU held by two jobs at once fails the second one.
    for g in gpus.split(","):
        p = os.path.join(os.environ["DEEPSEED_PARAM_LOCKDIR"], "gpu" + g)
        os.close(os.open(p, os.O_CREAT | os.O_EXCL))
        locks.append(p)

print("job %s on GPUs %s, lr=%s" % (os.environ.get("DEEPSEED_JOB_ID"), gpus, os.environ.get("DEEPSEED_PARAM_LR")),
      flush=True)
run = deepseed.init(flush_interval=0.1)
run.log_step(1, loss=0.7)
if mode == "sleep" or (mode == "retry" and not os.path.exists(sys.argv[2])):
    if mode == "retry":
        open(sys.argv[2], "w").close()
    time.sleep(120)
if mode == "sweep":
    time.sleep(1.0)
    lr, batch = float(os.environ["DEEPSEED_PARAM_LR"]), float(os.environ["DEEPSEED_PARAM_BATCH"])
    run.log_eval(1, accuracy=lr * batch / 2)
    run.log_eval(2, accuracy=lr * batch)
for p in locks:
    os.remove(p)
if mode == "fail":
    print("failing on purpose", file=sys.stderr, flush=True)
    sys.exit(1)
run.finish()
