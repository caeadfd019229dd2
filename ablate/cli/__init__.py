"""The `ablate` command line: main (train, base-model), sweep, tune, report."""
