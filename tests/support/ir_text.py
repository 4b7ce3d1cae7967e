"""IR text of small graphs that several test modules parse."""

from __future__ import annotations

# A chain with a foldable constant, a common subexpression and an identity: what canonicalize, fold-constants,
# cse and dce each have work on, and what any backend runs.
CHAIN = """graph main(%x: f32[2, 3]) {
  %a = identity(%x) : f32[2, 3]
  %c = constant() {value = dense<f32[3]> [1.0, 2.0, 3.0]} : f32[3]
  %d = neg(%c) : f32[3]
  %e = add(%a, %d) : f32[2, 3]
  %f = add(%a, %d) : f32[2, 3]
  %y = mul(%e, %f) : f32[2, 3]
  return %y
}
"""
