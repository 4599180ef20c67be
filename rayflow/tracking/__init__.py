"""MLflow, from the driver only: the invocation's parent run and the tracking store's preflight
(tracker), the Tune callback that mirrors each trial into a nested run (trial_runs), and runs
written by explicit id from any process (mlflow_runs)."""
