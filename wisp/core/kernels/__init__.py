"""Kernels: the torch reference of fused MoE and the Triton and native kernels, with the weight formats they read."""
