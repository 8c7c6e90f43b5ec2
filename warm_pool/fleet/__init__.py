"""The fleet as the controller knows it and acts on it: the independent facts it holds of
each worker (``facts.py``), each worker's view derived from them for the policy
(``view.py``), the decisions carried out on workers and providers (``actuator.py``) and
the worker's control API as the controller calls it (``control.py``), and what the
providers say of their instances taken in as facts (``instances.py``). It builds on the
feature folders (the policy's decisions, the providers' instances); none of them imports
it."""
