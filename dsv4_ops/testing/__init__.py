"""Testing tools of dsv4_ops, not needed to run the ops (import them explicitly):

* `dsv4_ops.testing.reference`: the oracle, docs/contract.md section 1 in plain PyTorch from
  whole sequences;
* `dsv4_ops.testing.worlds`: paged test worlds (requests, page tables, SWA mapping, state
  buffers, caches, inputs) for tests, benchmarks and examples;
* `dsv4_ops.testing.simulate`: a simulated serving engine that drives the ops step by step and
  checks every step against the oracle. It takes its RoPE table, weights, input rows, state
  buffers and caches from `worlds` and `dsv4_ops.layout`; its page tables are its own, because
  it allocates, shares and frees pages step by step as an engine does (that allocator is part
  of what it simulates), where a world describes one batch.
"""
