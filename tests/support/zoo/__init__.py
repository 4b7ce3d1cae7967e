"""The PyTorch model zoo of the tests and the benchmarks, in plain PyTorch (no torchvision, no
downloads), seeded so every build has the same weights.

``networks`` holds the full-size networks (``CASES``: the model tests; ``BENCHMARKS``: the
benchmark scripts); ``families`` the small models of each family the torch front end covers
(``MODELS``: builders of ``(model, example_args)``).  Import torch before this package only
where torch is installed: every module here imports it.
"""
