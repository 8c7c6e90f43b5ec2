"""Engine snapshots: capture and restore vLLM's warm state (compile caches) by fingerprint.

- :mod:`snapshotter.fingerprint` — what a snapshot is valid for (pure) and the runtime probe;
- :mod:`snapshotter.archive` — pack a cache root, unpack an archive without trusting it;
- :mod:`snapshotter.store` — layout and manifest (``thaw-snapshot/1``) in the object store;
- :mod:`snapshotter.ops` — restore before an engine start, capture after one (the worker's use);
- ``thaw snapshot build|ls|rm`` lives in :mod:`thaw.cli.snapshot` (it runs a worker agent).
"""
