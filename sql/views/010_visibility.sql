-- Re-appliable: functions that define generation visibility (applied when sql/views/ changes).

CREATE OR REPLACE FUNCTION corpusync.published_generation() RETURNS integer
LANGUAGE sql STABLE AS $$ SELECT published_generation FROM corpusync.index_state $$;
COMMENT ON FUNCTION corpusync.published_generation() IS 'The generation readers see now.';

CREATE OR REPLACE FUNCTION corpusync.visible_in(gen_from integer, gen_to integer, generation integer)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT gen_from <= generation AND (gen_to IS NULL OR gen_to > generation) $$;
COMMENT ON FUNCTION corpusync.visible_in(integer, integer, integer) IS
  'True when a row with this generation range is part of the given generation.';
