"""Figures for issue 21: per perturbation family, how many perturbations changed a HyperNode they do
not touch, how many HyperNodes that was, and how many trees got more roots (tests/kits/fabric_perturb.py).

    python tests/bench/tiers_damage_figures.py [--samples 12] [--seed 0]

Run it from outside the repository with PYTHONPATH pointing at another tree's `aggregator` and
`agent` (e.g. `git archive HEAD~N aggregator agent | tar -x -C /tmp/old`, then
`cd /tmp && PYTHONPATH=/tmp/old python /path/to/tests/bench/tiers_damage_figures.py`) to measure that
tree's tier inference with the same fabrics and perturbations.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))

import fabric_perturb as fp
from realparts import shared_data_dir

import aggregator


def fabrics() -> list[fp.Fabric]:
    found = [family() for family in fp.FAMILIES]
    dumps = shared_data_dir() / "ibnetdiscover"
    for path in sorted([*dumps.glob("*.t*"), *dumps.glob("ports/*.txt")]):
        fabric = fp.from_dump(str(path))
        if fabric.switch_cables or fabric.host_cables:
            found.append(fabric)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    print("aggregator from", aggregator.__file__)
    start = time.perf_counter()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for fabric in fabrics():
        base = fp.Snapshot.of(fp.render(fabric))
        for p in fp.perturbations(fabric, options.seed, options.samples):
            found = fp.changes(base, p, fp.Snapshot.of(fp.render(p.fabric, p.nodes)))
            roots = [f for f in found if " roots: " in f]
            row = totals[p.family]
            row[0] += 1
            row[1] += bool(found)
            row[2] += len(found) - len(roots)
            row[3] += bool(roots)
            if found:
                print(f"{fabric.name}: {p.family} [{p.label}]: {'; '.join(found[:3])}")
    print("family: perturbations with a change / run, HyperNodes changed, trees with more roots")
    for family, (run, changed, hypernodes, rooted) in totals.items():
        print(f"  {family:38s} {changed:4d}/{run:<4d} {hypernodes:5d} {rooted:4d}")
    print(f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
