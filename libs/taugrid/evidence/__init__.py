"""Evidence: each run's hash-chained ledger, its sealed bundle in the object store, and re-verification.

``ledger`` is pure; ``bundle`` assembles (and reads the run's output directories); ``store`` keeps the ledger
in the ``ledger`` KV bucket and writes bundles; ``verify`` re-checks everything against AUDIT.
"""
