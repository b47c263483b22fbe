"""submitter: validates submission events and creates each run once.

Owns: ``submit.requested`` → ``submit.accepted`` | ``submit.rejected``. (The run record is projected by
``run_record``.) ``ratelimit.py`` paces each workspace's new submissions (its one user, so it lives here).
"""
