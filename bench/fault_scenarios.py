"""The fault campaign's scenarios (bench/faults.py): kill -9 at chosen points of a refresh, the embedded
PostgreSQL killed mid-refresh, the main pid killed alone, two writers, a rollback during a refresh. Each
returns its record with "ok"."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from bench.fault_campaign import Campaign, converge, default_pool, previous_generation
from bench.fault_child import BUILD, PROGRESS, STAGES
from bench.fault_procs import Proc, Reader, content, home_url, last_run_id, run_row

MODES = {"startup": ["timer"], "finish": ["start"]}
# The reduced form (the test suite's): a kill inside each streamed stage. A kill at the start of finish
# (right after publish commits) is left to the full form and tests/test_edges.py, invariants included.
REDUCED_PLAN = "parse:mid,embed:mid,load:mid"


# --- (a) kills -------------------------------------------------------------------------------------------


def kill_plan(c: Campaign) -> list[tuple[str, str]]:
    """(stage, mode) per kill: 'start' pauses at the stage's start, 'mid' after a random item of it, 'timer'
    kills a random moment into it (as long as it lasted in the last uninterrupted run)."""
    text = c.cfg.plan or ("" if c.cfg.full or c.cfg.kills else REDUCED_PLAN)
    if text:
        return [(p.split(":")[0], ([*p.split(":"), "start"])[1]) for p in text.split(",")]
    n, rnd = c.cfg.kills or 39, 0
    plan: list[tuple[str, str]] = []
    while len(plan) < n:
        for stage in STAGES:
            modes = MODES.get(stage, ["start", "mid" if stage in PROGRESS else "timer"])
            plan.append((stage, modes[rnd % len(modes)]))
        rnd += 1
    return plan[:n]


def _point(c: Campaign, stage: str, mode: str) -> tuple[str, float]:
    marks = c.calibration
    if mode == "start":
        return stage, 0.0
    items = sum(1 for m in marks if m[1] == "advance" and m[2] == stage)
    if mode == "mid" and items:
        return f"{stage}@{c.rng.randint(1, max(1, items - 1))}", 0.0
    starts = [m[0] for m in marks if m[1] == "start"]
    t0 = next((m[0] for m in marks if m[1] == "start" and m[2] == stage), None)
    t1 = next((t for t in starts if t0 is not None and t > t0), marks[-1][0] if marks else 0.0)
    return "", c.rng.uniform(0, max(0.0, t1 - t0)) if t0 is not None else 0.0


def _past(stage: str, pause: str) -> int:
    """The last stage that may start before a pause at `stage` is reached: the streamed build's stages run
    batch by batch, so chunking (and embedding ...) starts while the parse workers are still at work."""
    if pause and stage in BUILD:
        return STAGES.index(BUILD[-1])
    return STAGES.index(stage)


def _kill_when(proc: Proc, stage: str, pause: str, delay: float, timeout: float) -> tuple[float | None, str]:
    deadline = time.monotonic() + timeout
    anchor = proc.t0 if stage == "startup" else None
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            return None, "finished before the kill"
        marks = proc.marks()
        if pause and any(m[1] == "paused" for m in marks) and proc.wait_paused(10):
            return proc.kill_tree(), "paused there"
        if not pause:
            anchor = anchor or next((m[0] for m in marks if m[1] == "start" and m[2] == stage), None)
            if anchor is not None and time.monotonic() >= anchor + delay:
                return proc.kill_tree(), "timer"
        if (pause or anchor is None) and any(m[1] == "start" and STAGES.index(m[2]) > _past(stage, pause)
                                              for m in marks):
            return proc.kill_tree(), "passed the point"
        time.sleep(0.005)
    return proc.kill_tree(), "timeout"


def kill_round(c: Campaign, stage: str, mode: str) -> dict[str, Any]:
    target = c.other()
    c.write_state(target)
    url = home_url(c.main)
    before, run_before = content(url), last_run_id(url)
    pause, delay = _point(c, stage, mode)
    proc = c.refresh(c.main, pause=pause, tag=f"kill-{stage}")
    kill_t, how = _kill_when(proc, stage, pause, delay, c.cfg.refresh_timeout_s)
    out = c.finish(proc, f"killed at {stage} ({mode})")
    rec: dict[str, Any] = {"stage": stage, "mode": mode, "pause": pause, "delay_s": round(delay, 3), "how": how,
                           "landed": proc.stage_at(kill_t) if kill_t is not None else "finished",
                           "killed_rc": out.rc, "peak_pss_mib": out.peak_rss >> 20}
    after = content(url)
    published = after.generation != before.generation
    rec["intact"] = (not published and after.docs == before.docs) or (published and after.docs == c.refs[target].docs)
    killed_run = last_run_id(url)
    converge(c, f"converge after a kill at {stage}", target, rec)
    if kill_t is not None and killed_run != run_before:
        rec["killed_run"] = row = run_row(home_url(c.main), killed_run)
        rec["run_record_ok"] = row.get("status") == ("published" if published else "crashed")
    else:
        rec["run_record_ok"] = True
    rec["ok"] = bool(rec["intact"] and rec["converged"] and rec["run_record_ok"])
    return rec


def postgres_kill(c: Campaign, variant: str = "group") -> dict[str, Any]:
    """SIGKILL the embedded PostgreSQL (its process group, or only the postmaster) while a refresh waits at
    the start of load; the refresh must fail with a clear error, the next one restart the server and
    converge."""
    import psutil

    target = c.other()
    c.write_state(target)
    proc = c.refresh(c.main, pause="load", tag=f"pg-kill-{variant}")
    rec: dict[str, Any] = {"variant": variant, "reached_load": proc.wait_paused(c.cfg.refresh_timeout_s)}
    pid = int((c.main / "pgdata" / "postmaster.pid").read_text().split()[0])
    os.killpg(os.getpgid(pid), signal.SIGKILL) if variant == "group" else os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.resume()
    out = c.finish(proc, f"refresh while PostgreSQL was killed ({variant})")
    rec["refresh"] = out.brief() | {"stderr_tail": out.stderr_tail[-800:]}
    rec["traceback"] = out.traceback  # Prefect logs the task's exception with its traceback (noise, not the answer)
    reason = str((out.summary or {}).get("reason") or out.stderr_tail.strip().splitlines()[-1:])
    rec["clear_error"] = out.rc == 2 and any(w in reason.lower() for w in ("database", "postgres"))
    converge(c, "converge after PostgreSQL was killed", target, rec)
    rec["ok"] = bool(rec["clear_error"] and rec["converged"])
    return rec


def main_pid_kill(c: Campaign) -> dict[str, Any]:
    """SIGKILL of the main pid only (as the OOM killer does), its own ephemeral Prefect API included: which
    processes of its tree outlive it?"""
    target = c.other()
    c.write_state(target)
    proc = c.refresh(c.main, pause="parse@1", ephemeral=True, tag="main-pid-kill",
                     env={"CORPUSYNC_MODEL_LINGER_S": "0",  # its model process in its tree, to be checked too
                          **default_pool()})
    rec: dict[str, Any] = {"reached_parse": proc.wait_paused(c.cfg.refresh_timeout_s)}
    rec["group_before"] = proc.group_alive()
    os.kill(proc.pid, signal.SIGKILL)
    time.sleep(3)
    rec["survivors_after_3s"] = proc.group_alive()
    c.finish(proc, "main pid killed (the rest of its group cleaned up after)")
    converge(c, "converge after the main pid was killed", target, rec)
    rec["ok"] = bool(not rec["survivors_after_3s"] and rec["converged"])
    return rec


# --- (c) concurrency ---------------------------------------------------------------------------------------


def two_writers(c: Campaign) -> dict[str, Any]:
    """A second refresh while the first holds the writer lock must exit 3; a reader polls the live content
    while the first resumes and publishes: every snapshot is the whole old or the whole new corpus."""
    target = c.other()
    c.write_state(target)
    url = home_url(c.main)
    before = content(url)
    first = c.refresh(c.main, pause="parse", tag="writer-1", env={"CORPUSYNC_RETENTION_GENERATIONS": "1"})
    rec: dict[str, Any] = {"first_holds_lock": first.wait_paused(c.cfg.refresh_timeout_s)}
    second = c.run(c.main, "second writer while the first holds the lock", tag="writer-2")
    rec["second"] = second.brief() | {"stderr_tail": second.stderr_tail[-400:]}
    reader = Reader(url, [before, c.refs[target]])
    reader.start()
    first.resume()
    out = c.finish(first, "first writer, resumed")
    time.sleep(0.5)
    reader.stop.set()
    reader.join(30)
    rec["first"] = out.brief()
    rec["reader"] = {"snapshots": reader.snapshots, "generations": reader.generations, "bad": reader.bad[:5]}
    converge(c, "converge after two writers", target, rec, retention=1)  # keeps a generation to roll back to
    rec["ok"] = bool(second.rc == 3 and out.rc == 0 and out.status == "published" and not reader.bad
                     and reader.snapshots >= 10 and len(reader.generations) == 2 and rec["converged"])
    return rec


def simultaneous_writers(c: Campaign) -> dict[str, Any]:
    """Two refreshes started together: exactly one publishes; the other exits 3 (or, when it got the lock
    only after the first finished, finds nothing to do)."""
    target = c.other()
    c.write_state(target)
    procs = [c.refresh(c.main, tag="race-1"), c.refresh(c.main, tag="race-2")]
    outs = [c.finish(p, "simultaneous writer") for p in procs]
    rec: dict[str, Any] = {"outcomes": [o.brief() for o in outs]}
    published = [o for o in outs if o.status == "published"]
    others = [o for o in outs if o.status != "published"]
    converge(c, "converge after simultaneous writers", target, rec)
    rec["ok"] = bool(len(published) == 1 and all(o.rc == 3 or o.status == "no_changes" for o in others)
                     and rec["converged"])
    return rec


def rollback_during_refresh(c: Campaign) -> dict[str, Any]:
    """`corpusync rollback` while a refresh waits at the start of publish: the rollback takes effect, the
    refresh must not publish over it, and the next refresh converges."""
    url = home_url(c.main)
    if previous_generation(url) is None:  # make one to roll back to
        c.write_state(c.other())
        c.run(c.main, "a generation to roll back to", env={"CORPUSYNC_RETENTION_GENERATIONS": "1"})
    target = c.other()
    c.write_state(target)
    prev_gen = previous_generation(url)
    prev = content(url, prev_gen) if prev_gen else None
    proc = c.refresh(c.main, pause="publish", tag="rollback-during")
    rec: dict[str, Any] = {"reached_publish": proc.wait_paused(c.cfg.refresh_timeout_s), "previous": prev_gen}
    rb = c.cli(c.main, "rollback")
    rolled = content(url)
    rec["rollback"] = rb.brief() | {"stdout": rb.stdout_tail[-300:], "stderr_tail": rb.stderr_tail[-300:]}
    rec["rolled_back_to_previous"] = bool(prev and rolled.generation == prev_gen and rolled.docs == prev.docs)
    proc.resume()
    out = c.finish(proc, "refresh resumed after a rollback")
    after = content(url)
    rec["refresh"] = out.brief() | {"stderr_tail": out.stderr_tail[-400:]}
    rec["refresh_kept_rollback"] = after.generation == rolled.generation and after.docs == rolled.docs
    converge(c, "converge after rollback during refresh", target, rec)
    rec["ok"] = bool(rb.rc in (0, 3) and rec["refresh_kept_rollback"] and rec["converged"]
                     and (rb.rc == 3 or rec["rolled_back_to_previous"]))
    return rec


# --- the whole campaign, and its table ----------------------------------------------------------------
