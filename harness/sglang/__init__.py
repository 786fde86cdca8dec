"""SGLang as an engine under test (the `engine` axis at `sglang`): a cell's axes as `sglang.launch_server` flags,
and the server's own word on whether its prefill graphs replayed."""
