"""The HyperNode tree as people read it: the model, its text, `dot` and explanation views, and the
`hypertopo-aggregator tree` command."""
