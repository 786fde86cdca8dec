"""The schemes: registry.py declares every one (torch-free); w8a8.py, int4.py and fp4.py hold their math (quantizers,
dequantizers, the reference every kernel is held to); nibbles.py and e2m1.py the 4-bit codes they share."""
