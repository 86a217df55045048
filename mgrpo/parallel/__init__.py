"""A role's trainer on W ranks (torch.distributed), on one machine or several: the group (`group`),
the policy held by the ranks — FSDP2 shards (`fsdp`) or a megatron-core GPTModel split by tensor
parallelism (`megatron` for the HF ↔ Megatron conversion and the model, `megatron_policy`) — and the
calls rank 0, the role's service, makes every rank run (`ranks`)."""
