"""Low-level pieces every layer uses: typed errors and exit codes, in-memory vector records, the lexical analyzer
(with its script classes and normalisation, and the lexical query syntax), process lifetime, offline defaults,
progress, the binary COPY encoder and the CLI's local Prefect API server.
Imports nothing from the rest of the repository.
"""
