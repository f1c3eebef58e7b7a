"""The measurements behind probes/ that the tests also run: the estimators' linear-Gaussian
toy, the bias of `resample`'s selected-token term, the seeds a comparison needs by design,
and a policy's samples scored image by image with their best-of-k (samples.py).
The probes (top-level probes/) print them; tests/test_estimators.py,
tests/test_ablation_script.py and tests/test_learning_checks.py check them at small sizes."""
