"""Cuvil's own fuzzer: seed models, structured and byte-level mutators, a child-process runner that
classifies each case's outcome, and a generator of random valid graphs from the op registry."""
