"""The CUDA kernels, one module per family; importing this package fills the kernel table."""

from cuvil.backends.cuda.kernels import conv, elementwise, linalg, movement, pool, rows, shape  # noqa: F401
