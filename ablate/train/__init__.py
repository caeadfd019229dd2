"""The one training loop and how it executes: trainer, rollout (the LM sampler), model loading and the
tiny base model, preemption handling at step boundaries."""
