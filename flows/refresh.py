"""The refresh flow: discover -> diff -> parse -> chunk -> embed -> validate -> load -> evaluate -> publish
-> prune.

Run it as `corpusync refresh PATH`, `python -m flows.refresh PATH`, or as a Prefect deployment
(prefect.yaml).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from corpusync.offline import apply_offline_defaults

apply_offline_defaults()

from prefect import flow  # noqa: E402
from prefect.runtime import flow_run  # noqa: E402

from corpusync.runtime import writer_session  # noqa: E402
from schemas.settings import Settings  # noqa: E402
from tasks import prefect_tasks as t  # noqa: E402


@flow(name="corpusync-refresh", log_prints=False, validate_parameters=False)
def refresh(
    source: str,
    allow_mass_delete: bool = False,
    reembed: bool = False,
    skip_gate: bool = False,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Bring the index in step with the folder `source`; publish the new generation if anything changed."""
    settings = settings or Settings()
    with writer_session(settings, Path(source), allow_mass_delete=allow_mass_delete, reembed=reembed,
                        skip_gate=skip_gate, prefect_flow_run_id=flow_run.get_id()) as ctx:
        found = t.discover(ctx)
        plan = t.diff(ctx, found)
        parsed = t.parse(ctx, plan)
        chunked = t.chunk(ctx, parsed, plan)
        embedded = t.validate(ctx, t.embed(ctx, chunked))
        generation = t.load(ctx, embedded, plan)
        t.evaluate(ctx, generation)
        t.publish(ctx, generation)
        t.prune(ctx)
    return ctx.summary.model_dump()


if __name__ == "__main__":
    from corpusync.cli import main

    sys.exit(main(["refresh", *sys.argv[1:]]))
