"""Side effects behind small interfaces: the embedding model (in this process or a process of its own), OCR engines and
the reranker. Heavy libraries are imported on first use.
"""
