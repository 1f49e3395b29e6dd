"""Checkpoints of a training run: writing them crash-safe, reading them back verified, exporting one.

    checkpointer.py  Checkpointer: the save/latest protocol every rank runs (the API)
    write.py         the writer's machinery: state validation, durable writes, snapshot buffers, the thread
    read.py          the COMPLETE marker's format, files verified as they load, the ranks' agreement
    crc.py           CRC32 of a file on several cores: what the marker records for each file
    sharded.py       ShardedCheckpointer: the same protocol with each rank's shards written by DCP
    export.py        one consolidated model state dict for inference (`dist-jobs export`)

What a checkpoint holds for the training loop, and how a run is restored from one, is the loop's
(dist_jobs.train.resume). Import from the module that defines a name: this __init__ imports
nothing, so crc.py (stdlib only) loads without torch.
"""
