"""The activator's HTTP API, one module-level router per API: the completions
(``completions``), models (``models``), usage (``usage``), the Files and Batches APIs
(``files``, ``batches``), the Responses and Conversations APIs (``responses``,
``conversations``) and the operators' ``/healthz`` and ``/metrics`` (``ops``). Each
route takes the activator's parts by dependency (``parts``) and does one thing: read
the request, call its service, answer; refusals are raised and answered in one place
(``calls``). ``activator.app`` builds the parts and mounts the routers.

May import ``thaw`` and the rest of ``activator``.
"""
