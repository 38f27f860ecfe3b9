"""Decode, retouch kernels, model runners and encode; each GPU path has a CPU twin.

Imports neither Faust nor Kafka. Images are ``(H, W, C)`` uint8 arrays, C = 3 (RGB) or
4 (RGBA); masks are ``(H, W)`` uint8 alpha (0 = background, 255 = subject). On the GPU
backend the arrays are CuPy arrays, on the CPU backend NumPy arrays.
"""
