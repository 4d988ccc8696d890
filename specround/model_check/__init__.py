"""Checkers: exact enumeration, Monte Carlo, z3 proofs, the mutation lab and the speedup ledger.

Production code never imports this package.
"""
