"""`dlop run --offloaders auto` with local daemons, end to end: real trainer, daemons, store and controller.

The training script knows nothing of dlop. Its Dataset costs a set time per
sample (a sleep read from a file, so the test can make it cheap mid-run) and
its step is fixed. From one daemon the fleet must grow on the stall its
controller measures, then shrink once the pipeline turns cheap,
with every epoch exactly once and every batch bit-identical to a fixed
fleet's. The controller's choices are read from `dlop run`'s log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import costly_dataset

from processes import offloader

pytest.importorskip("torch")

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.long_file(seconds=90)

SCRIPT = costly_dataset.HEAD + r'''
cost_file, step, cheap_at, total = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
loader = DataLoader(Costly(cost_file, 400), batch_size=4, shuffle=True)
epochs, stalls, k = [], [], 0
while k < total:
    batches, it = [], iter(loader)
    while True:
        asked = time.perf_counter()
        try:
            x, ids = next(it)
        except StopIteration:
            break
        stalls.append(time.perf_counter() - asked)
        batches.append([ids.tolist(), hashlib.sha1(x.numpy().tobytes()).hexdigest()])
        time.sleep(step)
        k += 1
        if k == cheap_at:
            with open(cost_file, "w") as f:
                f.write("0")
    epochs.append(batches)
print("RESULT " + json.dumps({"epochs": epochs, "stalls": stalls}), flush=True)
'''

STEP, SAMPLE = 0.04, 0.025  # one daemon makes a batch of 4 in 0.1 s: 2.5 steps' worth
# Epochs of 100 batches start at steps 0, 100, 200 and 300; an epoch's first batch is not leased before the
# epoch begins, so the stall is measured over steps 150-180, away from an epoch's start.
CHEAP_AT, TOTAL = 180, 400  # 220 cheap steps: shrinking waits for the busy fractions to fall, then 2 windows


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLOP_RUN_", "DLOP_OFFLOAD_TOKEN"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(tmp_path: Path, cost: float, *how: str) -> tuple[dict, str]:
    script, cost_file = tmp_path / "train.py", tmp_path / f"cost-{len(how)}"
    script.write_text(SCRIPT)
    cost_file.write_text(str(cost))
    command = [str(BIN / "dlop"), "run", *how, "--", sys.executable, str(script), str(cost_file), str(STEP),
               str(CHEAP_AT), str(TOTAL)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=_env())
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    # The log: dlop run's and the daemons' stderr, then what else they wrote on stdout (UCX's errors).
    said = "\n".join(x for x in done.stdout.splitlines() if not x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), done.stderr + said


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] not in "ZX"


def test_the_fleet_grows_until_the_stall_is_gone_then_shrinks_and_every_batch_is_a_fixed_fleets(tmp_path):
    offloader()
    made = f"dlop run: {TOTAL} batches made by dlop-offloader, 0 made locally"
    fixed, fixed_log = _run(tmp_path, 0.0, "--local-offloaders", "1")
    assert made in fixed_log, fixed_log
    got, log = _run(tmp_path, SAMPLE, "--offloaders", "auto", "--cores", "6", "--window", "1", "--hysteresis", "2",
                    "--cooldown-steps", "15", "--stall-target", "0.05")
    assert made in log, log
    # Bit-identical to the fixed fleet's, batch by batch; each epoch every sample once.
    assert got["epochs"] == fixed["epochs"]
    assert len(got["epochs"]) == TOTAL // 100
    for epoch in got["epochs"]:
        assert sorted(i for ids, _ in epoch for i in ids) == list(range(400))

    grew = [(int(a), int(b)) for a, b in re.findall(r"growing (\d+) -> (\d+); local: started", log)]
    shrank = [(int(a), int(b)) for a, b in re.findall(r"shrinking (\d+) -> (\d+); local: draining", log)]
    assert grew and grew[0][0] == 1 and max(b for _, b in grew) >= 3, log
    assert shrank and shrank[-1][1] < max(b for _, b in grew), log
    assert log.index("growing") < log.index("shrinking")
    # Each growth follows the windows of stall above the target that it names (a rate the test only reads
    # back: how far under the target the grown fleet keeps the stall is `python -m bench.autoscale`'s to
    # measure, beside a fixed fleet, not this parallel suite's on a machine whose load it does not own).
    why = re.findall(r"stall ([\d.]+)% of the step \(target ([\d.]+)%\)[^;]*? for (\d+) windows; estimate \d+: growing",
                     log)
    assert len(why) == len(grew) and all(float(r) > float(t) and int(n) >= 2 for r, t, n in why), log

    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", log)]
    assert pids and not any(_alive(p) for p in pids)  # every daemon it started is gone
