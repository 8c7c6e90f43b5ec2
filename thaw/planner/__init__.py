"""The capacity planner: from a traffic forecast to GPUs and dollars (`thaw plan`).

``catalog`` holds the published figures (models, GPUs, AWS instances), each with its
source; ``sizing`` is the arithmetic, pure, every step recorded with its formula;
``render`` prints a plan as a table, Markdown or JSON. docs/PLANNER.md explains the model.
"""
