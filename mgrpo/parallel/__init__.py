"""A role's trainer on W ranks (torch.distributed): the group (`group`), the policy sharded with FSDP2
(`fsdp`) and the calls rank 0 — the role's service — makes every rank run (`ranks`)."""
