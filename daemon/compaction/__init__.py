"""Compaction: moving the oldest active messages into the summary.

`compactor` drives one attempt per session; `inputs` reads what leaves and summarizes it;
`commit` holds the version-checked commit, the log entry and the result; `rules` says
where the tail may start and what a summary must satisfy before it is committed.
"""
