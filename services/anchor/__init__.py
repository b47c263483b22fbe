"""Anchor exporter: signs the ledger heads and AUDIT's position to a file outside the bus (the chart's answer to
the embedded stack supervisor's anchor thread; both run ``taugrid.evidence.anchor.Exporter``)."""
