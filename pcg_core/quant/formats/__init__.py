"""Checkpoint formats: detect.py reads what a checkpoint declares and maps it onto a scheme; checkpoint.py loads one
into the model (and writes synthetic ones); int4.py, fp4.py and experts.py read and write each format's tensors;
files.py resolves which safetensors files hold the checkpoint."""
