"""The controller's HTTP API, one module-level router per API: the operators' liveness
and leader (``ops``), the workers' heartbeats (``workers``), the activators' reports and
route long-poll (``activators``), the pool's status, events, budgets and clock
(``pool``), API keys (``keys``), the model and tenant registry and its catalog
(``registry``) and ``/metrics`` (``metrics``); the Files, Batches and stored-responses
APIs are their feature folders' (``warm_pool.batch``, ``warm_pool.conversations``).
Each route takes the controller's parts by dependency (``parts``) and hands over to
one; refusals are raised and answered from one table (``errors``). ``warm_pool.app``
builds the app and mounts the routers.
"""
