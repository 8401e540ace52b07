"""The application layer: the refresh steps and the build (pipeline, build, fanout, fastpath), the refresh's runtime
(connection, writer lock, run record), evaluation and tuning runs, exports and reader roles. flows/ wires these into
Prefect flows; the CLI calls them.
"""
