"""Where the activator sends each request: the controller's route table and the replicas
it lists (``replicas``), the lines a request waits in when there is no replica or no free
slot (``queues``), this activator's traffic counts (``activity``), the link to the
controller that brings the tables and takes demand and reports (``feed``), and the
``Router`` that ties them together (``router``): the one part the service, the batch
worker and the API call, and the only writer of the others' state.

Not a feature folder: the completion service, the API and ``activator.batch`` use it.
May import ``thaw`` and the rest of ``activator`` (not ``activator.api``).
"""
