"""Pure torch sampling: processors, softmax backends, counter-based RNG and the exact coupling.

Nothing in this package performs I/O or imports another part of specround.
"""
