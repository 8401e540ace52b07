"""The fault campaign's reduced form (issue 15; `python bench/faults.py --full` is the full one): kill -9 of
real `corpusync refresh` processes at chosen points, the embedded PostgreSQL killed mid-refresh, the main pid
killed alone, two writers, a reader during publish, rollback during a refresh, and a hostile corpus. Every
refresh is a real CLI process on its own embedded PostgreSQL; a module fixture indexes the two corpus states
first (the references are uninterrupted runs in fresh homes). The campaign's table is printed at the end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.fault_campaign import Campaign, Config
from bench.fault_scenarios import (
    REDUCED_PLAN,
    kill_round,
    main_pid_kill,
    postgres_kill,
    rollback_during_refresh,
    two_writers,
)
from bench.faults import all_ok, table
from tests.servers import PREFECT_DB, seed_prefect_db

pytestmark = [pytest.mark.slow, pytest.mark.flow, pytest.mark.db]

PLAN = [tuple(p.split(":")) for p in REDUCED_PLAN.split(",")]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
             prefect_db: Path) -> Iterator[Campaign]:
    # one parse worker where the pool is not the subject (the main-pid kill and the hostile corpus keep one per
    # CPU): the file run alone, 506 -> 460 s of CPU (the whole machine's), 340 -> 319 s
    root = tmp_path_factory.mktemp("faults")
    seed_prefect_db(prefect_db, root / "prefect" / PREFECT_DB)  # the shared Prefect API's home, migrated ahead
    c = Campaign(Config(root=root, keep=True, parse_workers=1))
    try:
        c.baseline()
        yield c
    finally:
        import time

        c.results["wall_s"] = round(time.monotonic() - c.t_start, 1)
        c.results["peak_pss_mib"] = c.peak_rss >> 20
        (c.root / "results.json").write_text(json.dumps(c.results, indent=2, ensure_ascii=False, default=str))
        reporter = request.config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("")
            for line in table(c.results).splitlines():
                reporter.write_line(line)
            reporter.write_line(f"raw results: {c.root / 'results.json'} (all ok: {all_ok(c.results)})")
        c.close()


def _why(rec: dict[str, Any]) -> str:
    keep = {k: v for k, v in rec.items() if k not in {"table", "verdicts"}}
    return json.dumps(keep, ensure_ascii=False, default=str)[:3000]


def test_incremental_refresh_equals_a_fresh_index(campaign: Campaign) -> None:
    assert campaign.results["baseline"]["incremental_equals_fresh"]


@pytest.mark.parametrize(("stage", "mode"), PLAN, ids=[f"{s}-{m}" for s, m in PLAN])
def test_kill_9_leaves_the_live_generation_intact_and_converges(campaign: Campaign, stage: str, mode: str) -> None:
    rec = kill_round(campaign, stage, mode)
    campaign.results["kills"].append(rec)
    assert rec["landed"] == stage, f"the kill was meant for {stage} but landed in {rec['landed']}: {_why(rec)}"
    assert rec["intact"], f"the published generation changed during the kill: {_why(rec)}"
    assert rec["converged"], f"the next refresh did not converge to an uninterrupted run's content: {_why(rec)}"
    assert rec["run_record_ok"], f"the killed run is recorded wrongly: {rec.get('killed_run')}"


def test_postgres_killed_mid_refresh_fails_clearly_and_the_next_refresh_recovers(campaign: Campaign) -> None:
    rec = postgres_kill(campaign, "group")
    campaign.results.setdefault("postgres", []).append(rec)
    assert rec["reached_load"]
    assert rec["converged"], f"the next refresh did not restart the server and converge: {_why(rec)}"
    assert rec["clear_error"], (
        f"a lost database must be a clear error naming the database with exit code 2 (README), not "
        f"rc={rec['refresh']['rc']} {rec['refresh'].get('reason')!r}: {rec['refresh']['stderr_tail'][-600:]}")


def test_sigkill_of_the_main_pid_leaves_no_process_behind(campaign: Campaign) -> None:
    rec = main_pid_kill(campaign)
    campaign.results["main_pid_kill"] = rec
    assert rec["reached_parse"]
    assert rec["converged"], _why(rec)
    assert not rec["survivors_after_3s"], f"processes outlived their refresh: {rec['survivors_after_3s']}"


def test_one_writer_at_a_time_and_readers_see_whole_generations(campaign: Campaign) -> None:
    rec = two_writers(campaign)
    campaign.results["two_writers"] = rec
    assert rec["first_holds_lock"]
    assert rec["second"]["rc"] == 3, f"a second writer must exit 3 (WriterBusy): {rec['second']}"
    assert rec["first"]["rc"] == 0 and rec["first"]["status"] == "published", rec["first"]
    reader = rec["reader"]
    assert not reader["bad"], f"a reader saw a mixed or missing corpus: {reader['bad']}"
    assert reader["snapshots"] >= 10 and len(reader["generations"]) == 2, reader
    assert rec["converged"], _why(rec)


def test_rollback_during_a_refresh_is_not_overwritten(campaign: Campaign) -> None:
    rec = rollback_during_refresh(campaign)
    campaign.results["rollback_during_refresh"] = rec
    assert rec["reached_publish"]
    assert rec["rollback"]["rc"] in (0, 3), rec["rollback"]
    if rec["rollback"]["rc"] == 0:
        assert rec["rolled_back_to_previous"], _why(rec)
    assert rec["refresh_kept_rollback"], f"the paused refresh published over the rollback: {_why(rec)}"
    assert rec["converged"], _why(rec)


def test_hostile_corpus(campaign: Campaign) -> None:
    from bench.hostile import run_hostile

    rec = run_hostile(campaign)
    campaign.results["hostile"] = rec
    report = "\n".join(rec.get("table", []))
    assert rec["good_run"]["rc"] == 0, rec["good_run"]
    assert rec["run"]["rc"] == 0 and "run_without_links" not in rec, (
        f"the run did not survive the hostile corpus: {rec['run']}\n{report}")
    wrong = {p: v for p, v in rec["verdicts"].items() if not v["ok"]}
    assert not wrong, f"files neither indexed correctly nor quarantined with a reason:\n{report}"
    assert not rec["good_changed"], f"good documents lost their live version: {rec['good_changed']}"
    assert not rec["dirty_chunks"] and not rec["unexpected"], report
    assert rec["peak_pss_mib"] <= rec["rss_bound_mib"], report
    assert rec["rerun"]["rc"] == 0, rec["rerun"]
