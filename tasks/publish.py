"""publish: the mass-delete guard a refresh passes before it may publish. Flipping the one-row generation
pointer (publish, rollback: one transaction each) is corpusync.store.generations."""

from __future__ import annotations

from typing import Any

from corpusync.core.errors import MassDeleteRefused
from schemas.records import DiffPlan


def check_mass_delete(plan: DiffPlan, max_fraction: float, allow: bool,
                      reference: dict[str, Any] | None = None) -> None:
    """Refuse a refresh that would remove more than max_fraction of the live documents, or that would take
    the index more than max_fraction below `reference` (the largest generation published recently:
    corpusync.store.generations.mass_delete_reference), so several refreshes in a row cannot empty it a slice
    at a time."""
    removed = plan.removed  # a document renamed or moved is not removed
    if allow or plan.live_before == 0 or not removed:
        return
    advice = ("If the source folder is mounted and the deletions are intended, run again with --allow-mass-delete "
              "(or raise CORPUSYNC_MAX_DELETE_FRACTION). Nothing was changed; the published generation stays live.")
    share = len(removed) / plan.live_before
    if share > max_fraction:
        raise MassDeleteRefused(
            f"this refresh would remove {len(removed)} of {plan.live_before} live documents "
            f"({share:.0%} > the {max_fraction:.0%} limit). {advice}"
        )
    if reference is None or not reference["live_documents"]:
        return
    before = int(reference["live_documents"])
    after = plan.live_before - len(plan.deleted) + len(plan.new)
    drop = (before - after) / before
    if drop > max_fraction:
        raise MassDeleteRefused(
            f"this refresh would leave {after} live documents where generation {reference['generation']} "
            f"(published {reference['published_at']:%Y-%m-%d %H:%M}) had {before}: {drop:.0%} fewer across recent "
            f"refreshes (> the {max_fraction:.0%} limit, counted over CORPUSYNC_MASS_DELETE_WINDOW_H). {advice}"
        )
