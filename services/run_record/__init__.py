"""run_record: projects RUNS into the ``run_state`` KV bucket, the record every other stage reads.

Owns: the ``runstate`` and ``runstate-high`` durables and the ``run_state`` bucket. Publishes nothing.
"""
