"""Gold sets, retrieval metrics and the evaluation gate (see issue: evaluation gates)."""
