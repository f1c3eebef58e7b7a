"""Real-model drivers of the GenEval and T2I-CompBench protocols (protocol
re-implementation): adapters turn detector / VQA / CLIP outputs into `Detection`s and
probabilities, the rules in margrpo.eval.geneval / margrpo.eval.t2i score them, and the
writers emit the official result formats. Heavy packages are imported inside adapters."""
