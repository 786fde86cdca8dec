"""The judge: one verdict on a graph candidate against eager on the same weights, in layers policy.py numbers.

- policy.py — the one policy: composes the layers into the cell's verdict and numbers them (1 eager against itself,
  2 the graph runs, 3 lockstep, 4 tokens and logprobs, 5 first diverging piece, 6 reference, 7 parallel); reads the
  cell through a Protocol, never imports the cell runner
- tolerances.py — every bound, with why it sits where it does, and the rules that widen one to a measured noise
- tokens.py — the token and logprob rule (layer 4, and layer 1's eager against itself): Judgement, compare
- lockstep.py — both engines in lockstep on their own KV caches: KL and same-padding (layer 3), the first diverging
  piece (layer 5)
- padding.py — is eager's padding exact? The float32 check and the attention backend's padding probe (layer 4's
  widened bound and its excuse)
- reference.py — the reference layer (layer 6): eager against transformers and the kernels' reference math
- kv_reference.py — the reference layer's FP8 KV cache: K and V rounded as the cache holds them

Importing the package imports none of them (harness/cell/run.py imports what it calls).
"""
