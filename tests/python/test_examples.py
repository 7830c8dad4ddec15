"""The examples run: examples/imagenet_ddp.py trains a step on the test accelerator, 2 ranks under torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], timeout: int = 240) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_imagenet_example_trains_on_the_test_accelerator():
    out = _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(ROOT / "examples/imagenet_ddp.py"),
                "--device", "dlop_test", "--arch", "none", "--image-size", "32", "--batch-size", "2", "--steps", "1",
                "--epochs", "1", "--classes", "10"])
    assert "backend dlop, 2 ranks on dlop_test" in out and "images/s" in out, out
