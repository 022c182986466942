"""examples/train_distributed.py as the README runs it: torchrun, 2 CPU
processes (gloo), DDP and FSDP2 (BF16 model; FP32 model under a BF16
MixedPrecisionPolicy), one epoch each."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("mode,dtype", [("ddp", "bf16"), ("fsdp2", "bf16"), ("fsdp2", "fp32-policy")])
def test_train_distributed_example(tmp_path, mode, dtype):
    pytest.importorskip("sklearn")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port),
           str(ROOT / "examples" / "train_distributed.py"), "--mode", mode, "--dtype", dtype, "--epochs", "2",
           "--checkpoint", str(tmp_path / "ckpt")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    last = [line for line in out.stdout.splitlines() if "test accuracy" in line]
    assert last and "params identical on every rank: True" in last[-1], out.stdout
    acc = float(last[-1].split("test accuracy ")[1].split("%")[0])
    assert acc > 80.0, last[-1]  # two epochs of the digits data set
    assert (tmp_path / "ckpt" / ".metadata").exists()
