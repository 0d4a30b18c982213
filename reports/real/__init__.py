"""Wrappers that put real attention implementations (installed from the registries, written by
nobody here) into attnconf's calling conventions, one folder each with its declaration, run file
and README. Each wrapper converts arrays and arguments only; it computes nothing itself."""
