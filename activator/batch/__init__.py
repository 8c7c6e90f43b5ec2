"""The Batches and Files APIs on the activator: the tenants' routes (``batches``,
``files``) and the worker that runs leased batch lines on the room online traffic leaves
(``worker``). The state is the controller's (``warm_pool.batch``), reached over its API.

May import ``thaw`` and the rest of ``activator``.
"""
