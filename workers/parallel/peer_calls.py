"""The calls a multi-node leader's training process makes of its worker through their channel
(``nodes.LeaderPeers``; the worker answers them in ``workers/queue/delivery.py``), named in a module of
their own so the worker's main process knows them without importing torch.distributed."""

ANNOUNCE = "peers_announce"
REMOTE_FAILURE = "peers_remote_failure"
