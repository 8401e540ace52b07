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
