"""ablate: ablation studies of RLVR (GRPO-family) recipes on language models."""

__version__ = "0.1.0"

from ablate.advantages import compute_advantages  # noqa: E402
from ablate.analysis import load_runs  # noqa: E402
from ablate.stats import pass_at_k  # noqa: E402

__all__ = ["compute_advantages", "load_runs", "pass_at_k", "__version__"]
