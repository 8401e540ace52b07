"""The thin query module: hybrid retrieval over the published generation, with citations."""

from query.search import Hit, Searcher, search

__all__ = ["Hit", "Searcher", "search"]
