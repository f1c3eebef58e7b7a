"""MAR-GRPO: stabilized GRPO for masked-autoregressive image generators."""
