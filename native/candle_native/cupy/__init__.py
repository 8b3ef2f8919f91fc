"""The CuPy GPU backend (`Device.cuda(i)`): the backend class and its raw CUDA kernels. Importing
this package does not import cupy; creating the backend does, with a clear message if it is
missing."""
