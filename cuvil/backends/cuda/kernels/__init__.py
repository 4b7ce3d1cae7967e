"""The CUDA kernels, one module per family; importing this package fills the kernel table."""

from cuvil.backends.cuda.kernels import elementwise, linalg, rows, shape  # noqa: F401
