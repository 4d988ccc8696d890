"""Round lifecycle, request state, commit records, the controller, fault points and the ports it needs.

Imports ``specround.sampling`` only; adapters implement the ports defined here.
"""
