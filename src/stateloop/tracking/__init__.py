"""MLflow: where every stage logs, one module per job.

- :mod:`~stateloop.tracking.store`: the store (its URI, a client that is safe to open from
  parallel jobs, artifacts beside a sqlite store, experiments, runs found or made by name);
- :mod:`~stateloop.tracking.records`: what a run records (params once, MLflow's own tags, datasets);
- :mod:`~stateloop.tracking.registry`: a run's final weights as an MLflow model, registered;
- :mod:`~stateloop.tracking.tracker`: training's run (:class:`~stateloop.tracking.tracker.Tracker`, rank 0) and its final model;
- :mod:`~stateloop.tracking.stages`: the stages after training (eval, analyze): their store, the run
  folder's MLflow run, and their results logged into it;
- ``python -m stateloop.tracking [URI]`` (``__main__.py``): open, and re-point, a moved store.
"""
