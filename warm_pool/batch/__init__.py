"""The Batches and Files APIs at the controller: the files index (``files``, and its
routes ``files_api``), the batches and their lines (``store``, routes ``api``) and the
leader's loop that validates, leases and finishes them (``runner``). The policy's stage
that lends standbys to batch work is pure, with the others: ``warm_pool.policy.batch``.

May import ``thaw`` and the rest of ``warm_pool``.
"""
