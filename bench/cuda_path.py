"""The workload's CUDA/NCCL path, for a machine with a GPU (CI has none): each strategy on 1 rank (NCCL where a
GPU is free for it), plain and with the SDC checks and a bit-30 gradient flip at step 3; flat-dp on 2 and 4 ranks
sharing the machine's GPUs (gloo on the CPU where they are fewer than the ranks); every step sampled for a replay
in flat-dp, ddp and hier-dp-overlap (any verdict a false alarm). One line per run: backend, median step, last
loss, SDC verdicts.

Usage: python bench/cuda_path.py  (env: STEPS=8, PRESET=tiny, ONLY=flat-dp,ddp,...; FORK=1: every rank forked from
one server that imported torch without touching CUDA, as the harness starts ranks, instead of a fresh python)
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from testbed.fabric.forkserver import ForkServer
from testbed.runner.ranks import PRELOAD, server_env
from testbed.workload.local import exec_rank, launch
from testbed.workload.options import Options

print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", flush=True)
base = Options(steps=int(os.environ.get("STEPS", "8")), preset=os.environ.get("PRESET", "tiny"), micro_batch=4,
               micro_batches=2, seed=3)
cases = {"flat-dp": replace(base, strategy="flat-dp"), "hier-dp": replace(base, strategy="hier-dp"),
         "hier-dp-overlap": replace(base, strategy="hier-dp-overlap", bucket_mb=0.1),
         "hier-dp int8": replace(base, strategy="hier-dp", compression="int8"),
         "ddp": replace(base, strategy="ddp", bucket_cap_mb=0.05), "fsdp": replace(base, strategy="fsdp"),
         "hsdp": replace(base, strategy="hsdp"),
         "diloco": replace(base, strategy="diloco", inner_steps=2),
         "streaming-diloco": replace(base, strategy="streaming-diloco", inner_steps=4, fragments=2),
         "async-diloco": replace(base, strategy="async-diloco", inner_steps=2)}
flip = [{"rank": 0, "step": 3, "target": "gradient", "bit": 30, "tensor": "1.attn.weight", "index": 100, "seed": 0}]
sdc = {"TESTBED_SDC": json.dumps(flip), "TESTBED_SDC_CHECK": "1"}


spawn = exec_rank
if os.environ.get("FORK") == "1":
    server_dir = tempfile.TemporaryDirectory()
    server = ForkServer.local(PRELOAD, Path(server_dir.name) / "forkserver.log", server_env(), lambda node: None)

    def spawn(module, args, env, log):
        return server.spawn("rank", module, args, env, log)


def one(name, opts, dcs, nodes, env, label):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "m"
        started = time.time()
        try:
            launch(dcs, nodes, [replace(opts, metrics_dir=str(metrics))], Path(tmp) / "l", timeout=400, env=env,
                   spawn=spawn)
        except Exception as error:
            print(f"{name:18} {label:5} {dcs}x{nodes} FAILED in {time.time() - started:.1f}s: "
                  f"{str(error)[-1200:]}", flush=True)
            return
        rows = [json.loads(line) for p in sorted(metrics.glob("rank*.jsonl")) for line in p.read_text().splitlines()]
        start = next(r for r in rows if r["event"] == "start")
        steps = [r for r in rows if r["event"] == "step" and r["step"] > 0]
        found = [(r["rank"], r["step"], r["detected_by"], r["classification"]) for r in rows
                 if r["event"] == "sdc_detected"]
        print(f"{name:18} {label:5} {dcs}x{nodes} ok backend={start['backend']} step_ms="
              f"{statistics.median(r['wall_s'] for r in steps) * 1e3:.1f} loss_last="
              f"{[r['loss'] for r in steps][-1]} sdc={found} in {time.time() - started:.1f}s", flush=True)


only = os.environ.get("ONLY")
for name, opts in cases.items():
    if only and name not in only.split(","):
        continue
    one(name, opts, 1, 1, {}, "plain")
    if name not in ("streaming-diloco", "async-diloco"):
        one(name, opts, 1, 1, sdc, "sdc")
for dcs, nodes in ((2, 1), (2, 2)):
    one("flat-dp", cases["flat-dp"], dcs, nodes, {}, "plain")


# sampled replays on the GPU: every step replayed, nothing injected: any verdict is a false alarm
replay = {"TESTBED_SDC_CHECK": "1", "TESTBED_SDC_REPLAY": "1"}
for name in ("flat-dp", "ddp", "hier-dp-overlap"):
    one(name, replace(cases[name], steps=12), 1, 1, replay, "rep1")
if spawn is not exec_rank:
    server.close()
    server_dir.cleanup()
