"""What runs in the engine host process, with vLLM imported ahead of time (``python -m
worker.engine_host``, ``__main__.py``): the engine core it forks (``engine_core_entry.py``)
and the two sides of a weight swap (``swap_server.py`` in front of vLLM's API,
``swap_core.py`` in the engine core). The agent never imports it (``tests/test_layering.py``):
the two processes speak only through ``worker.launch``'s messages over the host's pipe."""
