"""Many runs: sweep specs expanded to runs (pure), launched through submitit executors, and Optuna searches."""
