"""Benchmarks behind ``specround bench``: each measures its cases in one process and reports ratios.

Timings are interleaved (every repetition runs every case once, in the same order), preceded by warm-up
repetitions, and summarised by the median, so that ratios taken in one run share the machine's state.
"""
