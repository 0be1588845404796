"""Train wing, optimisers and schedules: AdamW with decay on matrices only and Muon for hidden matrices (`optim`,
`muon`), and the warm-up schedules (`optim`: noam, constant, cosine, wsd), which the `optim` and `schedule` config
groups name by `_target_`. Imports `archsweep.variants` and the train wing's `config`.
"""
