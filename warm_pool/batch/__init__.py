"""The Batches and Files APIs at the controller: the files index (``files``, and its
routes ``files_api``), the batches and their lines (``store``, routes ``api``), the
leader's loop that validates, leases and finishes them (``runner``), and the policy's
stage that lends standbys to batch work (``policy``, pure).

May import ``thaw`` and the rest of ``warm_pool``; the rest of ``warm_pool`` imports
``policy`` (a stage of ``decide``), ``store`` and ``files`` from here.
"""
