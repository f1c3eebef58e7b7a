"""The measurements behind probes/ that the tests also run: the estimators' linear-Gaussian
toy, the bias of `resample`'s selected-token term, and the seeds a comparison needs by design.
The probes (top-level probes/) print them; tests/test_estimators.py and
tests/test_ablation_script.py check them at small sizes."""
