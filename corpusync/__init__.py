"""corpusync: keep a pgvector retrieval index exactly in step with a changing document corpus."""

__version__ = "0.1.0"
