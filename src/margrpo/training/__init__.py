"""Training around the method: Trainer.collect and Trainer.update, the loop with evaluation
and checkpoints, step metrics and the gradient probe."""
