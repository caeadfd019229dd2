import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")  # tests/test_tracking.py opts in to offline explicitly
