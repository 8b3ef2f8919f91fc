"""The tensor core: Tensor and Var (with their math and shape mixins, conv, display), dtypes,
devices, shapes, autograd, the error hierarchy. Depends on nothing else in
candle_web but the backend interface it dispatches to; the package face re-exports its names."""
