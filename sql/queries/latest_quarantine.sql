-- The newest quarantine record of each path (of %(paths)s; NULL: every path) while it is open (a closed one
-- is history: the path has none), with the streak of identical open records it ends (same content,
-- pipeline, stage and reason; any other record in between, or a closed one, breaks it): its length
-- (attempts) and its first and last time. The diff skips unchanged bad files with it, and retries those of
-- a temporary cause once their back-off (from attempts and last_at) has run out.
WITH ranked AS (
    SELECT q.id, q.path, q.content_sha256, q.pipeline_fingerprint, q.stage, q.reason, q.error, q.created_at,
           q.resolved_at, first_value(q.id) OVER w AS latest_id,
           q.resolved_at IS NULL
           AND q.content_sha256 IS NOT DISTINCT FROM first_value(q.content_sha256) OVER w
           AND q.pipeline_fingerprint IS NOT DISTINCT FROM first_value(q.pipeline_fingerprint) OVER w
           AND q.stage = first_value(q.stage) OVER w
           AND q.reason = first_value(q.reason) OVER w AS same
    FROM corpusync.quarantine q
    WHERE %(paths)s::text[] IS NULL OR q.path = ANY (%(paths)s::text[])
    WINDOW w AS (PARTITION BY q.path ORDER BY q.created_at DESC, q.id DESC)
), streaks AS (
    SELECT r.*, bool_and(r.same) OVER (PARTITION BY r.path ORDER BY r.created_at DESC, r.id DESC) AS in_streak
    FROM ranked r
)
SELECT s.path,
       max(s.content_sha256) FILTER (WHERE s.id = s.latest_id) AS content_sha256,
       max(s.pipeline_fingerprint) FILTER (WHERE s.id = s.latest_id) AS pipeline_fingerprint,
       max(s.stage) FILTER (WHERE s.id = s.latest_id) AS stage,
       max(s.reason) FILTER (WHERE s.id = s.latest_id) AS reason,
       max(s.error) FILTER (WHERE s.id = s.latest_id) AS error,
       count(*) FILTER (WHERE s.in_streak)::int AS attempts,
       min(s.created_at) FILTER (WHERE s.in_streak) AS since,
       max(s.created_at) AS last_at
FROM streaks s
GROUP BY s.path
HAVING bool_or(s.id = s.latest_id AND s.resolved_at IS NULL)
