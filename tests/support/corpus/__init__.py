"""The real-model corpus: tiny ``transformers`` architectures with seeded weights, the routes by which they
reach Cuvil (torch.export, the TorchScript and dynamo ONNX exporters), and the store that compiles them
once per test module.

``models`` defines the architectures and their inputs, ``routes`` the exports and their on-disk cache,
``store`` the compiled models and PyTorch's outputs.  tests/models/test_corpus.py is the test.
"""
