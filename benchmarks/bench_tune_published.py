"""``fsdpviz.tune`` against the published training recipes of ``bench_published.py``.

For each published run (the rows of ``benchmarks/bench_published.py``, docs/cost.md's table),
tune is handed the job as a user would: the model as the recipe builds it, one rank's batch,
the recipe's own ``analyze`` keywords as the configuration to start from, the same GPUs
(machine and network) and ranks, and the recipe's tokens per rank per optimizer step (its
micro-batch times its accumulation). ``allow=`` names compile and float8 exactly where the
recipe used them; nothing is pinned (tune keeps a context-parallel mesh as given itself:
it has no context-parallel knob).

Three checks per row:

- **faster**: tune's best is predicted at least as fast (tokens/s per GPU) as the recipe, the
  recipe priced as ``bench_published.py`` prices it (its machine, optimizer and
  accumulation);
- **fits**: tune's best fits (its peak and the allocator's reserved estimate within the
  GPU's usable memory);
- **evaluated**: the recipe is among the configurations tune evaluated, decided by the plan:
  a candidate whose report has the recipe's units, every event of every iteration, the same
  configuration (how it was made aside: planned or replayed), peak and reserved memory, and
  tokens/s.

    python benchmarks/bench_tune_published.py [--only calibration|validation]
                                              [--rows SUBSTRING ...] [--markdown]
                                              [--workers N]

Prints a line per row as it finishes (the recipe's tokens/s and memory, tune's best's, what
tune changed, the ratio best / recipe, the checks, tune's wall time, why a check fails), then
the table and the summary: rows passing all three checks out of all.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_published as pub

import fsdpviz
from fsdpviz.cost import memory_model
from fsdpviz.errors import FsdpvizError
from fsdpviz.schema.memory import MemoryReport
from fsdpviz.tuning import Candidate, Tuning


@dataclass
class Outcome:
    row: pub.Row
    recipe_tps: float
    recipe_bytes: int  # what must fit: the larger of the peak and the reserved estimate
    recipe_fits: bool
    tuning: Tuning
    match: Candidate | None  # the candidate whose plan is the recipe's
    why_not: str  # when none is: what the nearest (the configuration as given) differs in

    @property
    def best(self) -> Candidate | None:
        return self.tuning.best

    @property
    def ratio(self) -> float:
        best = self.best
        return math.nan if best is None else best.tokens_per_s / self.recipe_tps

    @property
    def faster(self) -> bool:
        best = self.best
        return best is not None and best.tokens_per_s >= self.recipe_tps * (1 - 1e-9)

    @property
    def fits(self) -> bool:
        best = self.best
        return best is not None and best.fits

    @property
    def evaluated(self) -> bool:
        return self.match is not None

    @property
    def passed(self) -> bool:
        return self.faster and self.fits and self.evaluated

    def causes(self) -> list[str]:
        """Why each check that fails fails, as far as the run tells."""
        out = []
        if not self.faster and self.best is not None:
            if self.recipe_fits:
                out.append("faster: tune's best is slower than the recipe, which fits")
            else:
                usable = self.tuning.user.usable_bytes
                out.append(
                    f"faster: the recipe does not fit as modelled ({gib(self.recipe_bytes)} of "
                    f"{gib(usable)} GiB usable), and tune returns only what fits"
                )
        if not self.fits:
            out.append("fits: nothing tune evaluated fits")
        if not self.evaluated:
            out.append(f"evaluated: the nearest differs in {self.why_not}")
        return out

    def changed(self) -> str:
        """What tune's best changes from the configuration as given, knob by knob."""
        best, user = self.best, self.tuning.user
        if best is None:
            return "(nothing fits)"
        parts = [
            f"{k}: {user.knobs.get(k, '?')} -> {v}"
            for k, v in best.knobs.items()
            if user.knobs.get(k) != v
        ]
        return "; ".join(parts) or "nothing"


def tune_row(row: pub.Row, workers: int) -> Outcome:
    """Tune ``row``'s job from its recipe; the recipe priced as bench_published prices it."""
    job = pub.row_job(row)
    recipe = fsdpviz.analyze(
        job.model, job.inputs, machine=job.machine, progress=False, **job.kwargs
    )
    result = pub.Result(row, recipe)
    pub.predict([result])
    # the recipe's memory as tune models a candidate's: the last micro-step of the steady
    # optimizer step (accumulation without no_sync: the plan of one, repeated)
    mem = memory_model(recipe, optimizer=row.optimizer_name, grad_accum=pub.accum(row))
    recipe_bytes = int(max(mem.peak["bytes"], mem.reserved.get("bytes", 0)))
    allow = [k for k, used in (("compile", row.compile), ("float8", row.float8)) if used]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuning = fsdpviz.tune(
            job.model,
            job.inputs,
            config=job.kwargs,
            world_size=job.world_size,
            machine=job.machine,
            tokens_per_step=job.tokens_per_step,
            optimizer=row.optimizer_name,
            allow=allow,
            workers=workers,
            progress=False,
        )

    def differ(c: Candidate) -> list[str]:
        return differences(recipe, mem, result.predicted, row, c)

    match = next((c for c in tuning.candidates if not differ(c)), None)
    why = "; ".join(differ(tuning.user)) if match is None else ""
    return Outcome(row, result.predicted, recipe_bytes, bool(mem.fits), tuning, match, why)


def differences(
    recipe: fsdpviz.Report, mem: MemoryReport, tps: float, row: pub.Row, c: Candidate
) -> list[str]:
    """What differs between the recipe's plan (``mem``: its memory, ``tps`` its tokens/s)
    and candidate ``c``'s: units, events, the configuration (bar how it was made), memory,
    the micro-steps per optimizer step and how they reduce, tokens/s (none: the same
    plan)."""
    a, b = recipe, c.report
    out = []
    if [u.to_dict() for u in a.units] != [u.to_dict() for u in b.units]:
        out.append("units")
    events_a = [[e.to_dict() for e in it] for it in a.iterations]
    if events_a != [[e.to_dict() for e in it] for it in b.iterations]:
        out.append("events")
    ca, cb = a.config.to_dict(), b.config.to_dict()
    ca.pop("replayed", None)
    cb.pop("replayed", None)
    if ca != cb:
        keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        out.append("config (" + ", ".join(keys) + ")")
    if (mem.peak["bytes"], mem.reserved.get("bytes", 0)) != (c.peak_bytes, c.reserved_bytes):
        out.append("memory")
    each = row.grad_accum > 1 and not row.no_sync
    if (c.grad_accum, c.sync_each) != (row.grad_accum, each):
        how = "each reduced" if c.sync_each else "reduced after the last"
        out.append(f"micro-steps ({c.grad_accum}, {how})")
    if not math.isclose(tps, c.tokens_per_s, rel_tol=1e-9):
        out.append(f"tokens/s ({c.tokens_per_s:,.0f} against {tps:,.0f})")
    return out


def gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def line(o: Outcome) -> list[str]:
    best = o.best
    mark = {True: "yes", False: "no"}
    return [
        o.row.name,
        f"{o.recipe_tps:,.0f}",
        gib(o.recipe_bytes) + ("" if o.recipe_fits else " (does not fit)"),
        "-" if best is None else f"{best.tokens_per_s:,.0f}",
        "-" if best is None else gib(best.memory_bytes),
        mark[o.fits],
        f"{o.ratio:.3f}",
        mark[o.evaluated] + ("" if o.evaluated else f" ({o.why_not})"),
        o.changed(),
        f"{len(o.tuning.candidates)} ({o.tuning.traces} traced)",
        f"{o.tuning.seconds:.0f}",
        "; ".join(o.causes()),
    ]


HEADER = [
    "run", "recipe tok/s", "recipe GiB", "best tok/s", "best GiB", "best fits",
    "best / recipe", "recipe evaluated", "tune changed", "configurations", "tune s",
    "why a check fails",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=[pub.CAL, pub.VAL])
    parser.add_argument("--rows", nargs="*", default=[], help="rows whose name has a substring")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--workers", type=int, default=1, help="tune's workers (default 1)")
    args = parser.parse_args()
    rows = [
        r
        for r in pub.ROWS
        if args.only in (None, r.split)
        and (not args.rows or any(s in f"{r.source} {r.name}" for s in args.rows))
    ]
    started = time.perf_counter()
    outcomes = []
    errors: list[tuple[pub.Row, str]] = []
    for i, row in enumerate(rows, 1):
        try:
            o = tune_row(row, args.workers)
        except FsdpvizError as e:  # a job tune refuses: a failure of all three checks
            errors.append((row, str(e).splitlines()[0]))
            print(f"[{i}/{len(rows)}] {row.name} | tune refused it: {errors[-1][1]}", flush=True)
            continue
        outcomes.append(o)
        checks = " ".join(
            f"{name}={'ok' if ok else 'FAIL'}"
            for name, ok in (("faster", o.faster), ("fits", o.fits), ("evaluated", o.evaluated))
        )
        print(f"[{i}/{len(rows)}] " + " | ".join(line(o)) + f" | {checks}", flush=True)
    total = time.perf_counter() - started
    print()
    lines = [line(o) for o in outcomes]
    if args.markdown:
        print("| source | " + " | ".join(HEADER) + " |")
        print("|---|---|--:|--:|--:|--:|---|--:|---|---|--:|--:|---|")
        for o, cells in zip(outcomes, lines, strict=True):
            print(f"| {o.row.source} | " + " | ".join(cells) + " |")
    else:
        widths = [max(len(x[i]) for x in [HEADER, *lines]) for i in range(len(HEADER))]
        for cells in [HEADER, *lines]:
            print("  ".join(x.ljust(w) for x, w in zip(cells, widths, strict=True)))
    print()
    for row, error in errors:
        print(f"{row.source} {row.name}: tune refused it: {error}")
    passed = [o for o in outcomes if o.passed]
    ratios = [o.ratio for o in outcomes if not math.isnan(o.ratio)]
    total_rows = len(outcomes) + len(errors)
    print(
        f"{len(passed)} of {total_rows} rows pass all three checks (best at least as fast "
        f"as the recipe: {sum(o.faster for o in outcomes)}, best fits: "
        f"{sum(o.fits for o in outcomes)}, recipe evaluated: "
        f"{sum(o.evaluated for o in outcomes)})"
    )
    if ratios:
        print(f"best / recipe tokens/s: {min(ratios):.3f} to {max(ratios):.3f}")
    for o in outcomes:
        if not o.passed:
            failed = [n for n, ok in (("faster", o.faster), ("fits", o.fits),
                                      ("evaluated", o.evaluated)) if not ok]  # fmt: skip
            print(f"  failed {', '.join(failed)}: {o.row.source} {o.row.name}")
            for cause in o.causes():
                print(f"    {cause}")
    times = sorted(o.tuning.seconds for o in outcomes)
    if times:
        print(
            f"tune took {sum(times):.0f} s over {len(times)} rows (median "
            f"{times[len(times) // 2]:.0f} s, longest {times[-1]:.0f} s); the run {total:.0f} s"
        )


if __name__ == "__main__":
    main()
