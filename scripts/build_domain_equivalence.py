#!/usr/bin/env python3
"""Does this tree's ``build_domain`` build what another revision's builds? The same seeded random builds, run by
both trees, compared outcome by outcome (the XML, or the refusal and its wording).

    .venv/bin/python scripts/build_domain_equivalence.py [--rev REV] [--shapes 60] [--builds 2000] [--seeds 1,2,3,4]

The requests come from tests/unit/test_xml_build_shapes.py's generators (templates, options, pinning, host CPUs,
mdevs, PCI function groups, NIC VFs, disks, identities drawn from small pools so that sources collide): per seed,
``--shapes`` request shapes and ``--builds`` VMs drawn from them in turn, in one process, so a later VM of a shape
is built from what the builder kept of an earlier one. REV's package is taken with ``git archive`` into a
temporary directory. Exit status 1 when an outcome differs (the first difference is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# run by each tree's interpreter with that tree first on sys.path: prints the outcomes as JSON
RUN = r"""
import json, random, sys, tempfile
from pathlib import Path
import test_xml_build_shapes as gen
seed, shapes, builds = (int(x) for x in sys.argv[1:4])
user = Path(tempfile.mkdtemp()) / "user.xml"
user.write_text(gen.USER_TEMPLATE)
rnd = random.Random(seed)
pool = [gen._shape(rnd, user) for _ in range(shapes)]
print(json.dumps([gen._outcome(gen._vm(rnd, rnd.choice(pool))) for _ in range(builds)]))
"""


def outcomes(tree: Path, seed: int, shapes: int, builds: int) -> list[list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO / "tests" / "unit")])}
    done = subprocess.run([sys.executable, "-c", RUN, str(seed), str(shapes), str(builds)], env=env, cwd=tree,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _kind(outcome: list[str]) -> str:
    """A refusal's kind: lint's code, "source named twice", or the exception's class."""
    error, message = outcome
    if "already in domain" in message:
        return "source named twice"
    parts = message.split(": ")
    return parts[1] if error == "XmlError" and len(parts) > 2 else f"{error}: {parts[0]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="the revision to compare this working tree with")
    ap.add_argument("--shapes", type=int, default=60)
    ap.add_argument("--builds", type=int, default=2000)
    ap.add_argument("--seeds", default="1,2,3,4")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="build-equivalence-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", a.rev, "vgpuvirt", "templates"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        built = refused = 0
        kinds: set[str] = set()
        for seed in seeds:
            old, new = outcomes(Path(tmp), seed, a.shapes, a.builds), outcomes(REPO, seed, a.shapes, a.builds)
            for i, (o, n) in enumerate(zip(old, new, strict=True)):
                if o != n:
                    print(f"seed {seed}, build {i}: {a.rev} gave {o[0]}, this tree {n[0]}\n--- {a.rev}\n{o[1]}\n"
                          f"--- this tree\n{n[1]}")
                    return 1
                if n[0] == "ok":
                    built += 1
                else:
                    refused += 1
                    kinds.add(_kind(n))
    print(f"{built + refused} builds over seeds {a.seeds} ({a.shapes} shapes, {a.builds} builds each): the same "
          f"outcome from {a.rev} and this tree; {built} built, {refused} refused ({len(kinds)} kinds of refusal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
