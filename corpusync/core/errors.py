"""Typed exceptions with messages a user can act on. Each maps to a CLI exit code."""

from __future__ import annotations


class CorpusyncError(Exception):
    """Base class. exit_code is what the CLI returns for it."""

    exit_code = 2


class ConfigError(CorpusyncError):
    """A setting is missing or inconsistent."""


class DatabaseError(CorpusyncError):
    """The database cannot be reached or started."""


class MigrationError(DatabaseError):
    """The schema on disk and in the database disagree."""


class ParseError(CorpusyncError):
    """A document could not be turned into text. `reason` is a short code (encrypted, empty, ...)."""

    def __init__(self, path: str, reason: str, detail: str) -> None:
        self.path = path
        self.reason = reason
        self.detail = detail
        super().__init__(f"{path}: {reason}: {detail}")


class OcrError(CorpusyncError):
    """The OCR engine itself failed on an image (a model that did not load or run); the parser quarantines
    the document as 'ocr-error', a cause that can pass, not as a damaged file."""


class QuarantinedDocument(CorpusyncError):
    """A document was set aside at some stage; the run goes on and its previous version stays live."""

    def __init__(self, path: str, stage: str, reason: str, detail: str) -> None:
        self.path = path
        self.stage = stage
        self.reason = reason
        self.detail = detail
        super().__init__(f"{path}: quarantined at {stage}: {reason}: {detail}")


class WriterBusy(CorpusyncError):
    """Another refresh holds the single-writer lock."""

    exit_code = 3


class ModelMismatch(CorpusyncError):
    """The configured embedding model is not the one that built the published index."""


class MassDeleteRefused(CorpusyncError):
    """A refresh would remove too large a share of the corpus (an unmounted folder looks empty)."""

    exit_code = 1


class RollbackError(CorpusyncError):
    """There is no retained generation to roll back to."""


class EvalGateFailed(CorpusyncError):
    """The candidate generation retrieves worse than the baseline beyond tolerance."""

    exit_code = 1


# Exit codes (README): 0 success (also "nothing changed"), 1 refused, 2 error (configuration, input, database,
# model), 3 writer busy, 4 internal error (a bug: never reported as a refusal), 130 interrupted.
EXIT_REFUSED = 1
EXIT_ERROR = 2
EXIT_BUSY = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130


def as_user_error(exc: BaseException) -> CorpusyncError | None:
    """The error a user can act on that `exc` is (a lost database connection becomes a DatabaseError with a
    one-line message); None for an unexpected exception, which is a bug and is reported as one."""
    if isinstance(exc, CorpusyncError):
        return exc
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return None
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return DatabaseError(f"the database connection failed: {first}. Check that PostgreSQL is running and "
                             "reachable (`corpusync db status`); nothing was published by the failed step.")
    return None
