"""eagle_fx: graphs of hawk_fx kernels, staged from plain Python into Programs and replayed."""
__version__ = "0.1.0"
