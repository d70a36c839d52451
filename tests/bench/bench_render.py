"""`render` benchmark: wall time of `hypertopo-aggregator render --reports DIR` on saved reports.

    python tests/bench/bench_render.py [--model tests/models/nvl72-racks.yaml] [--runs 5] [--source DIR]

Every node of the model gets its NodeTopology report (agent.model_probe) saved as one YAML file,
as `kubectl get ntopo NAME -o yaml` would save it (not timed); then `python -m aggregator render
--reports DIR` runs `--runs` times in a fresh interpreter each, with the code under `--source`
(default: this checkout; give an exported older tree, `git archive REV agent aggregator | tar -x
-C DIR`, to compare). Prints best and median seconds as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from agent.cluster_model import load_model
from agent.common.report import node_topology_object
from agent.model_probe import report_for

ROOT = Path(__file__).resolve().parents[2]


def save_reports(model_file: str, folder: Path) -> int:
    model = load_model(model_file)
    for node in model.nodes():
        obj = node_topology_object(report_for(model, node))
        (folder / f"{node}.yaml").write_text(yaml.safe_dump(obj, sort_keys=False))
    return len(model.nodes())


def run(folder: Path, source: Path, runs: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(source)}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "aggregator", "render", "--reports", str(folder)],
            cwd=source,
            env=env,
            stdout=subprocess.DEVNULL,
            check=True,
        )
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "tests" / "models" / "nvl72-racks.yaml"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--source", default=str(ROOT), help="tree holding agent/ and aggregator/")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        count = save_reports(args.model, Path(tmp))
        times = run(Path(tmp), Path(args.source), args.runs)
    print(
        json.dumps(
            {
                "reports": count,
                "source": args.source,
                "best_s": round(min(times), 2),
                "median_s": round(statistics.median(times), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
