"""python -m bench.ft: recovery under torchft, dlop against torchft's Gloo wrapper in the same run.

For each backend and repetition: 2 replica groups of examples/torchft_ddp.py,
one lighthouse; replica 1 SIGKILLs itself mid-step and its torchrun restarts
it. Reported: the kill to the survivor's next committed step (and from the
failure's detection, the survivor's first failed step), the replacement's
start to its first step with both replicas, the steps the survivor lost; and
the steady step time under torchft against the same training under torch's
DDP without torchft (bench/ft/plain_ddp.py). Ratios are dlop's over Gloo's,
medians over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.ft.replicas import Run, _bin, recovery, run_replicas, steady_step_s

PLAIN = Path(__file__).resolve().parent / "plain_ddp.py"
BACKENDS = ("dlop", "gloo")


def plain_step_s(backend: str, out: Path, steps: int, useless_params: int) -> float:
    out.mkdir(parents=True, exist_ok=True)
    record = out / "steps.jsonl"
    record.unlink(missing_ok=True)
    done = subprocess.run([_bin("torchrun"), "--standalone", "--nproc-per-node=2", str(PLAIN), "--backend", backend,
                           "--steps", str(steps), "--record", str(record), "--useless-params", str(useless_params)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    (out / "torchrun.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"plain DDP over {backend} failed:\n{done.stderr[-3000:]}")
    run = Run(out, [0], [json.loads(line) for line in record.read_text().splitlines()])
    return steady_step_s(run)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ft", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24, help="committed steps of each kill run")
    parser.add_argument("--kill-at-step", type=int, default=6)
    parser.add_argument("--steady-steps", type=int, default=16)
    parser.add_argument("--useless-params", type=int, default=2_000_000)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=1000,
                        help="the lighthouse's: how long a silent replica stays in the quorum")
    parser.add_argument("--out", type=Path, default=Path("ft-results"))
    args = parser.parse_args()
    results: dict[str, dict[str, list]] = {b: {} for b in BACKENDS}

    def add(backend: str, figures: dict) -> None:
        for key, value in figures.items():
            results[backend].setdefault(key, []).append(value)

    for rep in range(args.repeats):
        for backend in BACKENDS:  # alternated, so that the machine's drift falls on both
            where = args.out / f"{backend}-{rep}"
            t = time.time()
            kill = run_replicas(backend, where / "kill", steps=args.steps, kill_at_step=args.kill_at_step,
                                useless_params=args.useless_params, heartbeat_timeout_ms=args.heartbeat_timeout_ms)
            figures = recovery(kill)
            figures["replicas_equal"] = all(
                kill.weights(0)[k].equal(kill.weights(1)[k]) for k in kill.weights(0))
            steady = run_replicas(backend, where / "steady", steps=args.steady_steps,
                                  useless_params=args.useless_params, heartbeat_timeout_ms=args.heartbeat_timeout_ms)
            figures["torchft_step_s"] = steady_step_s(steady)
            figures["plain_step_s"] = plain_step_s(backend, where / "plain", args.steady_steps, args.useless_params)
            figures["torchft_overhead"] = figures["torchft_step_s"] / figures["plain_step_s"]
            add(backend, figures)
            print(f"[{rep}] {backend} ({time.time() - t:.0f} s): "
                  + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()),
                  flush=True)

    def median(backend: str, key: str) -> float:
        return statistics.median(v for v in results[backend][key] if v is not None)

    rows = ["kill_to_next_commit_s", "kill_to_detected_s", "detected_to_next_commit_s", "restart_to_rejoin_s",
            "kill_to_rejoin_s", "steps_lost", "torchft_step_s", "plain_step_s", "torchft_overhead"]
    summary = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": results,
               "median": {b: {k: median(b, k) for k in rows} for b in BACKENDS},
               "dlop_over_gloo": {k: median("dlop", k) / median("gloo", k) for k in rows
                                  if median("gloo", k) not in (0, 0.0)}}
    print(f"\n{'median of ' + str(args.repeats):<28}{'dlop':>10}{'gloo':>10}{'dlop/gloo':>11}")
    for k in rows:
        ratio = summary["dlop_over_gloo"].get(k)
        print(f"{k:<28}{median('dlop', k):>10.3f}{median('gloo', k):>10.3f}"
              f"{'' if ratio is None else f'{ratio:>11.2f}'}")
    print("replicas equal after healing:", {b: results[b]["replicas_equal"] for b in BACKENDS})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
