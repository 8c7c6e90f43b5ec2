"""Who owns the machines: the ``Provider`` protocol (``provider``), its ``local``
(`thaw worker` processes on this machine) and ``ec2`` implementations, and how their
reports of instances are taken in as facts (``instances``).

May import ``thaw`` and the rest of ``warm_pool``.
"""
