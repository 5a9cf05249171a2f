"""The lowest layer: helpers that import nothing else from lmforge (files written atomically, eval mode
for a block of work, progress bars, timing side by side, which C allocator runs), so every package,
config included, may use them."""
