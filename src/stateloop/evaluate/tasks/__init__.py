"""Offline lm-eval tasks: every piece of code that lets lm-eval evaluate without the Hub.

- :mod:`~stateloop.evaluate.tasks.files`: the local task folder (``workflow/tasks/``), its YAMLs
  read and written with lm-eval's ``!function`` tags kept, the shared data folder and the readers
  of its files (imports no other module of the package, nor lm-eval);
- :mod:`~stateloop.evaluate.tasks.prepare`: the local YAMLs made runnable for one
  ``stateloop eval`` (absolute data paths, the synthetic and shared tasks' data written) and the
  task manager over the chosen tasks;
- :mod:`~stateloop.evaluate.tasks.hooks`: the ``custom_dataset`` hooks the local YAMLs name, so
  that lm-eval's own command line runs them from any folder (``--include_path workflow/tasks``).

lm-eval's own tasks, by their real names, over small local files for rehearsing a config offline
are operations code: :mod:`stateloop.ops.rehearse.task_data`.

The package's ``__init__`` imports nothing: each user imports the submodule it needs.
"""
