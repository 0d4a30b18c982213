"""Kernels in the torch SDPA calling convention, used to test the suite itself.

`correct` holds two honest implementations that must pass everything, `buggy`
holds copies of them with exactly one defect each (the suite must catch every
one), and `hostile` holds kernels that crash, hang, or misbehave, to exercise
`adapters.isolated`. All of them need torch; importing this package does not.
"""
