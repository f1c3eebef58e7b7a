"""The method's maths (docs/method.md): group advantages, the token plan and its selection, the
multi-trajectory estimators and the loss, as tensor functions."""
