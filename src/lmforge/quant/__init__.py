"""int8: quantised Linear and embedding layers, their kernels (torch's and lmforge's C code in csrc/),
the engines that run them and the per-machine store of which kernel won. Imports nothing from fast/."""
