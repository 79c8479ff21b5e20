"""``python -m tests.mutation``: mutate modules, run the tests that cover each, report what survived.

A report, not a gate: the exit status is 0 whatever survived, 2 when the tool itself cannot run, and 1
only with ``--fail-under PCT`` and a score below it. See docs/mutation.md.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from .mutants import Mutant, mutants_of
from .run import Outcome, Worker, baseline, check_copy, merge, run_all, run_mutant, workers
from .select import ImportGraph, module_name

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PATHS = ["vgpuvirt/provision", "vgpuvirt/services/capacity/budget.py", "vgpuvirt/services/capacity/build.py",
                 "vgpuvirt/services/capacity/per_type.py"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.splitlines()[0])
    p.add_argument("--paths", nargs="+", default=DEFAULT_PATHS, help="modules or folders to mutate (from --root)")
    p.add_argument("--exclude", nargs="*", default=[], help="modules or folders under --paths to leave alone")
    p.add_argument("--root", type=Path, default=REPO, help="repository to copy (default: this one)")
    p.add_argument("--tests", nargs="+", default=["tests/unit", "tests/property"], help="test folders to select from")
    p.add_argument("--depth", type=int, default=1, help="import hops between a test and the module (default 1)")
    p.add_argument("--marker", default="not integration and not slow", help="pytest -m expression for the runs")
    p.add_argument("--max", type=int, default=0, help="sample this many mutants (default: all)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once (one repository copy each)")
    p.add_argument("--timeout-factor", type=float, default=3.0, help="a mutant's run may take this x the baseline")
    p.add_argument("--min-timeout", type=float, default=60.0, help="seconds, the least a mutant's run may take")
    p.add_argument("--budget", type=float, default=0.0, help="minutes: start no mutant after this (0: no limit)")
    p.add_argument("--json", type=Path, help="also write the outcomes here")
    p.add_argument("--survivors-of", type=Path, metavar="JSON",
                   help="run only the mutants that survived (or timed out) in this earlier --json report")
    p.add_argument("--list", action="store_true", help="print the (sampled) mutants and run nothing")
    p.add_argument("--fail-under", type=float, help="exit 1 when the score (%% detected) is below this")
    return p


def _targets(root: Path, paths: Sequence[str], exclude: Sequence[str]) -> list[Path]:
    out: list[Path] = []
    skip = [(root / e).resolve() for e in exclude]
    for p in paths:
        full = root / p
        if not full.exists():
            raise ValueError(f"no such path under {root}: {p}")
        files = sorted(full.rglob("*.py")) if full.is_dir() else [full]
        out += [f for f in files if "__pycache__" not in f.parts
                and not any(f.resolve().is_relative_to(s) for s in skip)]
    return out


def _report(outcomes: list[Outcome], order: dict[str, tuple[str, ...]], empty: list[str],
            not_run: int) -> tuple[str, float]:
    per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for o in outcomes:
        per[o.mutant.path][o.status] += 1
    lines = [f"{'module':<46} {'tried':>5} {'killed':>6} {'surv':>5} {'t/o':>4} {'err':>4} {'score':>6} {'tests':>5}"]
    total: dict[str, int] = defaultdict(int)
    for path in sorted(per):
        c = per[path]
        tried = sum(c.values())
        for k, v in c.items():
            total[k] += v
        score = 100.0 * (c["killed"] + c["timeout"]) / max(1, tried - c["error"])
        lines.append(f"{path:<46} {tried:>5} {c['killed']:>6} {c['survived']:>5} {c['timeout']:>4} {c['error']:>4} "
                     f"{score:>5.0f}% {len(order[path]):>5}")
    tried = sum(total.values())
    score = 100.0 * (total["killed"] + total["timeout"]) / max(1, tried - total["error"])
    lines.append(f"{'TOTAL':<46} {tried:>5} {total['killed']:>6} {total['survived']:>5} {total['timeout']:>4} "
                 f"{total['error']:>4} {score:>5.0f}%")
    if not_run:
        lines.append(f"not run (budget spent): {not_run}")
    for path in empty:
        lines.append(f"not mutated: {path}: no test file within --depth imports it")
    surv = sorted((o for o in outcomes if o.status in ("survived", "timeout", "error")),
                  key=lambda o: (o.mutant.path, o.mutant.line, o.mutant.start))
    if surv:
        lines.append("")
        lines.append("survivors (score counts a timeout as detected):")
        for o in surv:
            tag = "" if o.status == "survived" else f"   [{o.status}{': ' + o.detail[:120] if o.detail else ''}]"
            lines.append(f"  {o.mutant.describe()}{tag}")
    return "\n".join(lines), score


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = args.root.resolve()
    t0 = time.monotonic()
    files = _targets(root, args.paths, args.exclude)
    graph = ImportGraph(root, [root / t for t in args.tests])
    sources = {f.relative_to(root).as_posix(): f.read_text(encoding="utf-8") for f in files}
    every: list[Mutant] = []
    for rel, src in sources.items():
        every += mutants_of(src, rel)
    if args.survivors_of:
        # the same code gives the same mutant ids: a rerun shows which survivors new tests now kill
        before = json.loads(args.survivors_of.read_text())["outcomes"]
        again = {o["id"] for o in before if o["status"] in ("survived", "timeout")}
        every = [m for m in every if m.ident in again]
        if len(every) != len(again):
            print(f"{len(again) - len(every)} earlier survivors are not mutants of this code (it changed)")
    rng = random.Random(args.seed)
    chosen = rng.sample(every, args.max) if args.max and args.max < len(every) else list(every)
    # a splice that does not give the intended tree is dropped, never run (see Mutant.check)
    valid = [m for m in chosen if m.check(sources[m.path])]
    print(f"mutants: {len(every)} in {len(files)} modules; sampled {len(chosen)} (seed {args.seed}); "
          f"{len(chosen) - len(valid)} dropped as invalid", flush=True)
    if args.list:
        for m in sorted(valid, key=lambda m: (m.path, m.start)):
            print(f"  {m.describe()}")
        return 0
    wanted = sorted({m.path for m in valid})
    selections = {p: graph.select(module_name(root, root / p), args.depth) for p in wanted}
    union = sorted({t for sel in selections.values() for t in sel.tests})
    package = module_name(root, root / wanted[0]).split(".")[0] if wanted else ""
    jobs = max(1, args.jobs)
    with workers(root, jobs) as pool:
        check_copy(pool[0], package)
        # one baseline for every selected file, cut in one chunk per worker
        chunks = [tuple(union[i::jobs]) for i in range(jobs)]
        base = merge(run_all(pool, [(lambda w, c=c: baseline(w, c, args.marker)) for c in chunks]))  # type: ignore[misc]
        print(f"baseline: {len(union)} test files, {sum(base.file_seconds.values()):.0f} s of test time"
              f"{f', {len(base.deselect)} tests failing unmutated (deselected)' if base.deselect else ''}", flush=True)
        if not base.ok:
            raise RuntimeError(base.detail)
        order: dict[str, tuple[str, ...]] = {}
        for p, sel in selections.items():
            # closest first, then fastest first: with -x a killed mutant usually costs one quick file
            order[p] = tuple(sorted(sel.tests, key=lambda t: (sel.distance[t], base.file_seconds.get(t, 0.0), t)))
        empty = [p for p in wanted if not order[p]]
        runnable = [m for m in valid if order[m.path]]
        deadline = t0 + args.budget * 60 if args.budget else None
        done: list[Outcome] = []

        def task(m: Mutant) -> Callable[[Worker], object]:
            def go(w: Worker) -> object:
                if deadline is not None and time.monotonic() > deadline:
                    return None
                tests = order[m.path]
                secs = sum(base.file_seconds.get(t, 0.0) for t in tests)
                o = run_mutant(w, m, tests, base, args.marker, max(args.min_timeout, args.timeout_factor * secs))
                done.append(o)
                print(f"[{len(done)}/{len(runnable)}] {o.status:<8} {o.seconds:5.1f}s {m.describe()}", flush=True)
                return o
            return go

        results = run_all(pool, [task(m) for m in runnable])
    outcomes = [o for o in results if isinstance(o, Outcome)]
    text, score = _report(outcomes, order, empty, len(results) - len(outcomes))
    print()
    print(text)
    print(f"\nwall time: {(time.monotonic() - t0) / 60:.1f} min, jobs {args.jobs}, depth {args.depth}, "
          f"marker {args.marker!r}")
    if args.json:
        args.json.write_text(json.dumps({
            "score": score,
            "outcomes": [{"id": o.mutant.ident, "path": o.mutant.path, "line": o.mutant.line, "kind": o.mutant.kind,
                          "status": o.status, "seconds": round(o.seconds, 1), "detail": o.detail,
                          "describe": o.mutant.describe()} for o in outcomes],
            "tests": {p: list(t) for p, t in order.items()},
            "deselected": list(base.deselect),
        }, indent=1) + "\n")
    if args.fail_under is not None and score < args.fail_under:
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # the tool itself broke: say so in one line, exit 2
        print(f"mutation: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
