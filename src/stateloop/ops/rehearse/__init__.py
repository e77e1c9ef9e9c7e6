"""Rehearsals: a config's own DAG run offline on a CPU, with every setting the user's run
exercises kept and only sizes shrunk (``stateloop rehearse``).

- :mod:`stateloop.ops.rehearse.config`: the shrunk config derived from a real one;
- :mod:`stateloop.ops.rehearse.mirrors`: local folders in a hub dataset's file layout and schema;
- :mod:`stateloop.ops.rehearse.task_data`: lm-eval's own task definitions over small local data files.
"""
