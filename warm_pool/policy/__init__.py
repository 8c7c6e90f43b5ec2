"""The controller's policy, pure: ``decide`` (one function from a snapshot of the world
to decisions, composed of stages), the decisions themselves and their one exhaustive
dispatch (``decisions``), and the stages' parts: the replica autoscaler (``autoscaler``),
the learned keep-alive (``keepalive``), the standby sizer (``sizer``), the pools' budgets
(``budget``) and scheduled pre-warm (``prewarm``). Batch's stage is ``warm_pool.policy.batch``.

No I/O and no clock: time is passed in. May import ``thaw`` and ``warm_pool.policy.batch``.
"""
