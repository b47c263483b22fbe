"""submitter: validates submission events, creates each run once, and projects RUNS into the run_state KV.

Owns: ``submit.requested`` → ``submit.accepted`` | ``submit.rejected``; and the ``runstate`` projection.
"""
