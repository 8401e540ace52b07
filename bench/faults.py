"""The fault campaign (issue 15): kill -9 of refreshes at points spread over every stage, the embedded
PostgreSQL killed mid-refresh, a hostile corpus, two writers, a reader during publish, rollback during a
refresh. Every refresh is a real `corpusync --home H refresh SRC --json` process (through
bench/fault_child.py, which only adds stage marks and an optional SIGSTOP at a chosen point so a kill lands
exactly there).

The parts: fault_child.py (the child process), fault_procs.py (a process, its marks and peak memory; what a
home serves and must never hold), fault_campaign.py (configuration, homes, references, convergence),
fault_scenarios.py (the kills, two writers, rollback during a refresh); bench/hostile.py (the hostile
corpus). This file runs them and prints the table.

    python bench/faults.py [--full] [--kills N] [--plan parse:mid,load:start] [--out results.json] [--keep]

Reduced form (the default; tests/test_fault_campaign.py runs it in CI): 3 kills, small hostile inputs, a
Prefect API shared by the refreshes. --full: 39 kills (3 per stage), the evaluation gate on (so `evaluate`
is a kill point), hostile sizes of hundreds of MB, each refresh with its own ephemeral Prefect API (its
server is part of the process tree that is killed). Either form: the refreshes of a home share one model
process, as the CLI's do by default, except the hostile refresh and the main-pid kill, which hold the model in
their own tree. Prints a table and writes the raw results as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.fault_campaign import Campaign, Config  # noqa: E402
from bench.fault_child import STAGES  # noqa: E402
from bench.fault_scenarios import (  # noqa: E402
    kill_plan,
    kill_round,
    main_pid_kill,
    postgres_kill,
    rollback_during_refresh,
    simultaneous_writers,
    two_writers,
)


def run_all(c: Campaign, phases: list[str]) -> None:
    from bench import hostile

    c.baseline()
    r = c.results
    if "kills" in phases:
        for stage, mode in kill_plan(c):
            r["kills"].append(kill_round(c, stage, mode))
    if "postgres" in phases:
        r["postgres"] = [postgres_kill(c, v) for v in (["group", "postmaster"] if c.cfg.full else ["group"])]
    if "orphan" in phases:
        r["main_pid_kill"] = main_pid_kill(c)
    if "concurrency" in phases:
        r["two_writers"] = two_writers(c)
        if c.cfg.full:
            r["simultaneous_writers"] = simultaneous_writers(c)
        r["rollback_during_refresh"] = rollback_during_refresh(c)
    if "hostile" in phases:
        r["hostile"] = hostile.run_hostile(c)


def all_ok(r: dict[str, Any]) -> bool:
    parts = [*r.get("kills", []), *r.get("postgres", [])]
    parts += [r[k] for k in ("main_pid_kill", "two_writers", "simultaneous_writers", "rollback_during_refresh",
                             "hostile") if k in r]
    return bool(parts) and all(p.get("ok") for p in parts)


def _yn(v: Any) -> str:
    return "yes" if v else "NO"


def table(r: dict[str, Any]) -> str:
    cfg = r.get("config", {})
    lines = [f"corpusync fault campaign: {'full' if cfg.get('full') == 'True' else 'reduced'} form, seed "
             f"{cfg.get('seed')}, Prefect API {cfg.get('prefect')}, gate {cfg.get('gate')}", "",
             "(a) kill -9 of the refresh process tree, then a converging refresh and prune",
             f"{'stage':<10}{'planned':>8}{'landed':>8}{'exact':>7}{'intact':>8}{'converged':>10}{'run rec':>9}"]
    kills = r.get("kills", [])
    for stage in [*STAGES, "finished"]:
        planned = sum(k["stage"] == stage for k in kills)
        here = [k for k in kills if k["landed"] == stage]
        if planned or here:
            lines.append(f"{stage:<10}{planned:>8}{len(here):>8}{sum(k['how'] == 'paused there' for k in here):>7}"
                         f"{sum(bool(k['intact']) for k in here):>8}{sum(bool(k['converged']) for k in here):>10}"
                         f"{sum(bool(k['run_record_ok']) for k in here):>9}")
    lines.append(f"{'total':<10}{len(kills):>8}{len(kills):>8}{sum(k['how'] == 'paused there' for k in kills):>7}"
                 f"{sum(bool(k['intact']) for k in kills):>8}{sum(bool(k['converged']) for k in kills):>10}"
                 f"{sum(bool(k['run_record_ok']) for k in kills):>9}")
    for k in kills:
        if not k["ok"]:
            lines.append(f"  FAILED kill at {k['stage']}/{k['mode']} (landed {k['landed']}): intact {k['intact']}, "
                         f"equal {k.get('equal_to_uninterrupted')}, invariants {k.get('invariants')}, converge "
                         f"{k.get('converge', {}).get('rc')} {k.get('converge', {}).get('status')}, run "
                         f"{k.get('killed_run')}")
    for p in r.get("postgres", []):
        ref = p["refresh"]
        lines.append(f"  PostgreSQL killed ({p['variant']}) at load: refresh rc={ref['rc']} "
                     f"(Prefect tracebacks on stderr: {p['traceback']}) reason={str(ref.get('reason'))[:120]!r}; "
                     f"next refresh converged: {_yn(p['converged'])}")
    if m := r.get("main_pid_kill"):
        lines.append(f"  main pid only killed: {len(m['group_before'])} other processes in its group, "
                     f"{len(m['survivors_after_3s'])} alive 3 s later {m['survivors_after_3s'][:2]}; "
                     f"converged: {_yn(m['converged'])}")
    if h := r.get("hostile"):
        lines += ["", "(b) hostile corpus", *h.get("table", [])]
    lines += ["", "(c) concurrency"]
    if w := r.get("two_writers"):
        lines.append(f"  second refresh while one holds the lock: rc={w['second']['rc']} (expected 3); first: rc="
                     f"{w['first']['rc']} {w['first']['status']}")
        lines.append(f"  reader during publish: {w['reader']['snapshots']} snapshots, generations "
                     f"{w['reader']['generations']}, {len(w['reader']['bad'])} mixed/missing")
    if s := r.get("simultaneous_writers"):
        lines.append("  two refreshes started together: " + ", ".join(f"rc={o['rc']} {o['status']}"
                                                                     for o in s["outcomes"]))
    if b := r.get("rollback_during_refresh"):
        lines.append(f"  rollback during refresh: rollback rc={b['rollback']['rc']}, previous generation live: "
                     f"{_yn(b['rolled_back_to_previous'])}; resumed refresh rc={b['refresh']['rc']} "
                     f"{str(b['refresh'].get('reason') or b['refresh'].get('stderr_tail', ''))[-140:]!r}; "
                     f"rollback kept: {_yn(b['refresh_kept_rollback'])}; converged {_yn(b['converged'])}")
    lines += ["", f"time {r.get('wall_s')} s; peak memory of a refresh process tree (PSS) {r.get('peak_pss_mib')} MiB; "
              f"all checks passed: {_yn(all_ok(r))}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the full form: 39 kills, large hostile inputs")
    ap.add_argument("--kills", type=int, help="number of kills (spread over the stages in order)")
    ap.add_argument("--plan", default="", help="explicit kill points, e.g. parse:mid,load:start,startup:timer")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--gate", action=argparse.BooleanOptionalAction, default=None,
                    help="configure a gold set so evaluate is a real stage (default: on with --full)")
    ap.add_argument("--prefect", choices=["shared", "ephemeral"], help="one Prefect API for all refreshes, or "
                    "one per refresh (default: ephemeral with --full, else shared)")
    ap.add_argument("--rss-bound-mib", type=int, default=0,
                    help="bound on the hostile refresh's peak memory (summed PSS of its process tree; default: "
                    "tree_budget_mib() for this machine's parse workers)")
    ap.add_argument("--parse-workers", type=int, default=0,
                    help="parse workers of the refreshes whose subject is not the pool (default: one per CPU)")
    ap.add_argument("--only", default="kills,postgres,orphan,concurrency,hostile",
                    help="comma-separated phases to run")
    ap.add_argument("--root", type=Path, help="work folder (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (homes, run logs)")
    ap.add_argument("--out", type=Path, help="write the raw results here as JSON")
    a = ap.parse_args(args)
    cfg = Config(full=a.full, kills=a.kills, plan=a.plan, seed=a.seed, gate=a.gate, prefect=a.prefect or "",
                 rss_bound_mib=a.rss_bound_mib, root=a.root, keep=a.keep,
                 parse_workers=a.parse_workers)
    campaign = Campaign(cfg)
    try:
        run_all(campaign, a.only.split(","))
    finally:
        campaign.results["wall_s"] = round(time.monotonic() - campaign.t_start, 1)
        campaign.results["peak_pss_mib"] = campaign.peak_rss >> 20
        print(table(campaign.results))
        if a.out:
            a.out.write_text(json.dumps(campaign.results, indent=2, ensure_ascii=False, default=str))
        campaign.close()
    return 0 if all_ok(campaign.results) else 1


if __name__ == "__main__":
    sys.exit(main())
