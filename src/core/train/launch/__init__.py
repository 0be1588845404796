"""Train wing, how one run's processes start and split: ranks started by torchrun (`torchrun`), the tasks of a
submitit job and its requeue (`submitit_job`), FSDP2 sharding (`shard`). Imports `archsweep.variants`; no other
part of the train wing.
"""
