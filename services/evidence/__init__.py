"""The evidence service: per-run hash-chained ledgers and sealed evidence bundles (see ``handlers``)."""
