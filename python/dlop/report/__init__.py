"""dlop.report: what ``dlop report`` prints and writes.

- ``dlop report FILE.json...`` (tables.py): benchmark JSON (of ``dlop-bench``
  and of the Python benchmarks in the source tree's bench/) as markdown
  tables and PNG plots, each figure the median over the files of one kind.
- ``dlop report linearity --from-json FILE`` (linearity.py): the DDP
  linearity report, predicted for 16-1024 ranks under the cluster
  assumptions given, from the measurements of ``python -m bench.linearity``;
  the scaling model is scaling_model.py, its terms linearity_terms.py.
- ``dlop report trace DIR`` (trace.py): a ``DLOP_TRACE`` folder as one table
  of how long each process's operations waited and ran.
"""
